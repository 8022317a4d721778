"""The guest agent: runs commands that the host drops into the spool, and hands back their results.

It runs inside each guest (chrooted into the host's root) as `python3 -I -S agent.py`, so it uses
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

With `--resident-python VENV/bin/python` the agent also starts `belugactl.lab.guest.resident_cli` under that
Python: the resident CLI, a belugactl that has imported the CLI once and forks per command. A request that
runs this venv's belugactl (`belugactl ...`, `VENV/bin/belugactl ...`, `VENV/bin/python -m belugactl
...`, optionally behind `env K=V ...`) with no PYTHONPATH or the resident CLI's own checkout on it is
handed to it; everything else, and everything while it is not running, is spawned as before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
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
RESIDENT_SOCKET = "/run/belugactl-resident-cli.sock"  # tmpfs inside the guest: a unix socket cannot live on 9p
RESIDENT_WAIT_S = 240.0  # a command that arrives while the resident CLI still imports waits for it


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
    def __init__(
        self, spool: str, hostname: str, resident_python: str = "", resident_socket: str = RESIDENT_SOCKET
    ) -> None:
        self.spool = spool
        self.resident_socket = resident_socket
        self.resident_python = os.path.abspath(resident_python) if resident_python else ""
        self.resident_proc: subprocess.Popen | None = None
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
        self._start_resident()

    # --- the resident CLI (belugactl.lab.guest.resident_cli) ------------------------------------------
    def _start_resident(self) -> None:
        if not self.resident_python or not os.path.exists(self.resident_python):
            return
        for stale in (self.resident_socket, self.resident_socket + ".json"):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            with open(os.path.join(self.spool, "resident-cli.log"), "ab") as log:
                self.resident_proc = subprocess.Popen(  # noqa: S603 - fixed argv
                    [self.resident_python, "-m", "belugactl.lab.guest.resident_cli", "--socket", self.resident_socket],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", env=env, start_new_session=True,
                )
        except OSError:
            self.resident_proc = None

    def _resident_args(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
        """The belugactl arguments and environment when the resident CLI can run this request."""
        if not self.resident_proc:
            return None
        env = dict(env)
        if argv and argv[0] in ("env", "/usr/bin/env", "/bin/env"):
            argv = argv[1:]
            while argv and "=" in argv[0] and not argv[0].startswith(("-", "=")):
                key, value = argv[0].split("=", 1)
                env[key] = value
                argv = argv[1:]
        if not argv:
            return None
        bindir = os.path.dirname(self.resident_python)
        first = argv[0]
        if "/" not in first:
            found = shutil.which(first, path=env.get("PATH", ""))
            first = found or first
        if os.path.abspath(first) == os.path.join(bindir, "belugactl"):
            args = argv[1:]
        elif os.path.dirname(os.path.abspath(first)) == bindir and argv[1:3] == ["-m", "belugactl"]:
            args = argv[3:]
        else:
            return None
        root = self._resident_root()
        path = env.get("PYTHONPATH", "").rstrip("/")
        if root is None or (path and path != root):
            return None
        return args, env

    def _resident_root(self) -> str | None:
        try:
            with open(self.resident_socket + ".json") as fh:
                return str(json.load(fh)["root"]).rstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            pass
        # Not ready yet: wait while it imports (a cold import under TCG takes tens of seconds).
        deadline = time.monotonic() + RESIDENT_WAIT_S
        while self.resident_proc and self.resident_proc.poll() is None and time.monotonic() < deadline:
            if os.path.exists(self.resident_socket):
                return self._resident_root()
            time.sleep(0.1)
        return None

    def _run_resident(self, args: list[str], env: dict[str, str], cwd: str, work: str, req_id: str,
                  start: float, timeout: float | None) -> dict | None:
        """Run through the resident CLI; None when it cannot take the request (then spawn instead)."""
        stdin_path = os.path.join(work, "stdin")
        request = {
            "argv": args, "env": env, "cwd": cwd,
            "stdin": stdin_path if os.path.exists(stdin_path) else os.devnull,
            "stdout": os.path.join(work, "stdout"), "stderr": os.path.join(work, "stderr"),
        }
        for name in ("stdout", "stderr"):
            open(request[name], "wb").close()  # the child opens them without O_CREAT
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.resident_socket)
            conn.sendall((json.dumps(request) + "\n").encode())
            conn.settimeout(CANCEL_CHECK_S)
        except OSError:
            conn.close()
            return None  # not running: spawn instead (nothing has run yet)
        # From here on the command may have started: never fall back to running it a second time.
        pid: int | None = None
        killed: dict = {}
        buf = b""
        try:
            while True:
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    chunk = None
                if chunk == b"":
                    if pid is None:
                        return None
                    return {"rc": 1, "error": "the resident CLI went away", "resident": True, **killed}
                if chunk:
                    buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if "rc" in msg:
                        return {"rc": int(msg["rc"]), "resident": True, **killed}
                    if "pid" not in msg:
                        return None if pid is None else {"rc": 1, "error": str(msg), "resident": True}
                    pid = int(msg["pid"])
                timed_out = timeout is not None and time.monotonic() - start > timeout
                cancelled = os.path.exists(os.path.join(self.cancel_dir, req_id))
                if pid is not None and (timed_out or cancelled) and not killed:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                    killed = {"timed_out": timed_out, "cancelled": cancelled}
                    if timed_out:
                        killed["rc_override"] = RC_TIMEOUT
        except (OSError, ValueError) as exc:
            if pid is None:
                return None
            return {"rc": 1, "error": f"lost the resident CLI: {exc}", "resident": True, **killed}
        finally:
            conn.close()

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
        resident = self._resident_args(argv, env)
        done = self._run_resident(resident[0], resident[1], cwd, work, req_id, start, timeout) if resident else None
        if done is not None:
            if done.pop("rc_override", None) is not None:
                done["rc"] = RC_TIMEOUT
            elif done.get("cancelled"):
                done["rc"] = 130
            result.update(done)
            result["duration_s"] = round(time.monotonic() - start, 4)
            self._finish(work, result)
            self.last_work = time.monotonic()
            return
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
    parser.add_argument("--resident-python", default="", help="start the resident CLI under this Python")
    parser.add_argument("--resident-socket", default=RESIDENT_SOCKET)
    args = parser.parse_args(argv)
    agent = Agent(args.spool, args.hostname, args.resident_python, args.resident_socket)
    agent.start()
    agent.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
