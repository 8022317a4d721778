"""The guest agent: runs commands that the host drops into the spool, and hands back their results.

It runs inside each guest (chrooted into the host's root) as `python3 -I -S guest_agent.py`, so it uses
the standard library only and imports nothing from belugactl. The spool is a directory the host
exports read-write over 9p; one request is one folder, so requests never share a file:

    req/<id>.json          the host's request (written elsewhere, then renamed here: appears whole)
    out/<id>/stdin         optional input, written by the host before the request
    out/<id>/request.json  the agent claims a request by renaming it here
    out/<id>/stdout|stderr the command's output, written as it runs (the host streams it)
    out/<id>/status.json   the result, renamed into place last: its presence means "done"
    cancel/<id>            the host gave up (timeout, Ctrl-C): kill the command's process group
    ready, heartbeat       the agent is up; refreshed every few seconds

A request is {"argv": [...], "timeout": seconds, "cwd": path, "env": {...}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HEARTBEAT_S = 5.0
# Every look at the spool is a 9p round trip, which costs real CPU under TCG (at 10 Hz an idle agent
# took about 7% of a host core). So poll fast while commands come, and back off when none do: the
# first command after a long pause waits up to a second; the ones after it, a few milliseconds.
POLL_STEPS_S = ((10.0, 0.05), (60.0, 0.25), (float("inf"), 1.0))  # (idle for less than, poll every)
CANCEL_CHECK_S = 0.5
RC_TIMEOUT = 124
RC_NOT_FOUND = 127


def _uptime() -> float:
    try:
        with open("/proc/uptime") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError):
        return -1.0


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _exit_status(returncode: int) -> int:
    # As a shell reports it: a command killed by signal N exits 128+N.
    return 128 - returncode if returncode < 0 else returncode


class Agent:
    def __init__(self, spool: str, hostname: str) -> None:
        self.spool = spool
        self.hostname = hostname
        self.req_dir = os.path.join(spool, "req")
        self.out_dir = os.path.join(spool, "out")
        self.cancel_dir = os.path.join(spool, "cancel")
        self.last_work = time.monotonic()  # commands usually follow a boot at once

    def start(self) -> None:
        for d in (self.req_dir, self.out_dir, self.cancel_dir):
            os.makedirs(d, exist_ok=True)
        ready = {
            "hostname": socket.gethostname(),
            "expected_hostname": self.hostname,
            "uptime_s": _uptime(),
            "agent_pid": os.getpid(),
            "kernel": os.uname().release,
            "python": sys.version.split()[0],
        }
        _write_atomic(os.path.join(self.spool, "ready"), json.dumps(ready) + "\n")

    def serve_forever(self) -> None:
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = now + HEARTBEAT_S
            try:
                names = sorted(os.listdir(self.req_dir))
            except OSError:
                names = []
            for name in names:
                if name.endswith(".json") and not name.startswith("."):
                    self._claim(name[: -len(".json")])
            idle = 0.0 if threading.active_count() > 1 else now - self.last_work
            time.sleep(next(delay for limit, delay in POLL_STEPS_S if idle < limit))

    def _beat(self) -> None:
        with contextlib.suppress(OSError):
            _write_atomic(os.path.join(self.spool, "heartbeat"), f"{_uptime()}\n")

    def _claim(self, req_id: str) -> None:
        self.last_work = time.monotonic()
        work = os.path.join(self.out_dir, req_id)
        claimed = os.path.join(work, "request.json")
        try:
            os.makedirs(work, exist_ok=True)
            os.replace(os.path.join(self.req_dir, req_id + ".json"), claimed)
            with open(claimed) as fh:
                request = json.load(fh)
        except (OSError, ValueError) as exc:
            self._finish(work, {"rc": 2, "error": f"unreadable request: {exc}"})
            return
        threading.Thread(target=self._run, args=(req_id, work, request), daemon=True).start()

    def _run(self, req_id: str, work: str, request: dict) -> None:
        start = time.monotonic()
        argv = [str(a) for a in request.get("argv", [])]
        timeout = float(request.get("timeout") or 0) or None
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
        cwd = request.get("cwd") or "/"
        if not os.path.isdir(cwd):
            cwd = "/"
        stdin_path = os.path.join(work, "stdin")
        result: dict = {"rc": None, "timed_out": False, "cancelled": False}
        try:
            with (
                open(stdin_path if os.path.exists(stdin_path) else os.devnull, "rb") as fin,
                open(os.path.join(work, "stdout"), "wb") as fout,
                open(os.path.join(work, "stderr"), "wb") as ferr,
            ):
                try:
                    proc = subprocess.Popen(  # noqa: S603 - argv list from the host, no shell
                        argv, stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, env=env, start_new_session=True
                    )
                except (OSError, ValueError) as exc:
                    ferr.write(f"belugactl-lab agent: cannot run {argv[:1]}: {exc}\n".encode())
                    result["rc"] = RC_NOT_FOUND
                    result["error"] = str(exc)
                else:
                    result.update(self._wait(proc, req_id, start, timeout))
        except OSError as exc:
            result["rc"] = 1
            result["error"] = f"agent I/O error: {exc}"
        result["duration_s"] = round(time.monotonic() - start, 4)
        self._finish(work, result)
        self.last_work = time.monotonic()

    def _wait(self, proc: subprocess.Popen, req_id: str, start: float, timeout: float | None) -> dict:
        cancel = os.path.join(self.cancel_dir, req_id)
        while True:
            try:
                rc = proc.wait(timeout=CANCEL_CHECK_S)
                return {"rc": _exit_status(rc)}
            except subprocess.TimeoutExpired:
                pass
            timed_out = timeout is not None and time.monotonic() - start > timeout
            cancelled = os.path.exists(cancel)
            if timed_out or cancelled:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {"rc": RC_TIMEOUT if timed_out else 130, "timed_out": timed_out, "cancelled": cancelled}

    @staticmethod
    def _finish(work: str, result: dict) -> None:
        with contextlib.suppress(OSError):
            _write_atomic(os.path.join(work, "status.json"), json.dumps(result) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spool", required=True)
    parser.add_argument("--hostname", default="")
    args = parser.parse_args(argv)
    agent = Agent(args.spool, args.hostname)
    agent.start()
    agent.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
