"""Run a ServePlan: start in order, wait for readiness, restart crashes with backoff, stop cleanly.

Order: the metadata server first (its `/readyz`), then every vLLM instance (their `/health`).
Each process runs in its own session (process group) so a stop reaches vLLM's engine and worker
children too. A process that dies after it was ready is restarted after 1, 2, 4, ... seconds; after
`max_restarts` it is given up on, loudly, and the rest keep serving. A process that dies or times
out BEFORE it was ever ready fails the start: everything started is stopped, nothing is left running.
State (pids, ports, status, restarts) is kept in `<run_dir>/state.json` for `status` and `stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from belugactl.errors import BelugaError, EnvironmentProblem, ExitCode
from belugactl.workflows.serve.plan import ProcessSpec, ServePlan

STATE_FILE = "state.json"


class StartFailed(BelugaError):
    """A process did not become ready; everything started was stopped again."""

    exit_code = ExitCode.FAILED


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - our own loopback URLs
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_json(url: str, timeout: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def terminate_group(
    pid: int, *, grace_s: float = 20.0, is_alive: Callable[[int], bool] = pid_alive, sig: str = "SIGTERM"
) -> None:
    """Signal the process group led by pid (SIGTERM, or SIGUSR1 for HAProxy's drain), wait, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, getattr(signal, sig))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # The leader may be gone while children of its group live on: killpg above reached them.


@dataclass
class Managed:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes] | None = None
    status: str = "pending"  # pending | starting | ready | restarting | failed | stopped
    restarts: int = 0
    ever_ready: bool = False
    next_start: float = 0.0
    log: IO[bytes] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "kind": self.spec.kind,
            "pid": self.proc.pid if self.proc else None,
            "port": self.spec.port,
            "health_url": self.spec.health_url,
            "log_file": self.spec.log_file,
            "stats_prefix": self.spec.stats_prefix,
            "stop_signal": self.spec.stop_signal,
            "status": self.status,
            "restarts": self.restarts,
        }


class Supervisor:
    def __init__(
        self,
        plan: ServePlan,
        *,
        max_restarts: int = 3,
        backoff_s: float = 1.0,
        poll_s: float = 0.5,
        stop_grace_s: float = 20.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.run_dir = Path(plan.run_dir)
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.poll_s = poll_s
        self.stop_grace_s = stop_grace_s
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.procs = [Managed(spec) for spec in plan.processes]
        self._stop_requested = False
        self.state = "starting"

    # -- state file -------------------------------------------------------------------------
    def write_state(self) -> None:
        doc = {
            "supervisor_pid": os.getpid(),
            "state": self.state,
            "updated": time.time(),
            **{k: v for k, v in self.plan.to_dict().items() if k != "processes"},
            "processes": [m.to_dict() for m in self.procs],
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, self.run_dir / STATE_FILE)

    # -- signals ----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._stop_requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # -- processes --------------------------------------------------------------------------
    def _spawn(self, m: Managed) -> None:
        Path(m.spec.log_file).parent.mkdir(parents=True, exist_ok=True)
        if m.log is None:
            m.log = open(m.spec.log_file, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        m.log.write(f"\n=== belugactl serve: starting {m.spec.name}: {' '.join(m.spec.argv)}\n".encode())
        m.log.flush()
        for path, text in m.spec.files:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        env = {**os.environ, **m.spec.env}
        try:
            m.proc = subprocess.Popen(  # noqa: S603 - argv list built by the plan, never a shell
                list(m.spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=m.log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot start {m.spec.name}: {exc.strerror}: {m.spec.argv[0]}",
                fix="install it (scripts/bootstrap-vllm for vLLM) or fix the path",
            ) from None
        m.status = "starting"
        self.write_state()

    def _wait_ready(self, group: list[Managed]) -> None:
        deadline = {m.spec.name: time.monotonic() + m.spec.ready_timeout_s for m in group}
        waiting = list(group)
        while waiting:
            if self._stop_requested:
                raise KeyboardInterrupt
            for m in list(waiting):
                assert m.proc is not None
                code = m.proc.poll()
                if code is not None:
                    raise StartFailed(
                        f"{m.spec.name} exited with status {code} before it was ready",
                        why=log_tail(m.spec.log_file) or "(empty log)",
                        fix=f"read {m.spec.log_file}",
                    )
                if m.spec.health_url is None or http_ok(m.spec.health_url):
                    m.status = "ready"
                    m.ever_ready = True
                    waiting.remove(m)
                    self.say(f"serve: {m.spec.name} ready" + (f" on port {m.spec.port}" if m.spec.port else ""))
                    self.write_state()
                elif time.monotonic() > deadline[m.spec.name]:
                    raise StartFailed(
                        f"{m.spec.name} was not ready within {m.spec.ready_timeout_s:.0f} s ({m.spec.health_url})",
                        why=log_tail(m.spec.log_file) or "(empty log)",
                        fix=f"read {m.spec.log_file}",
                    )
            time.sleep(self.poll_s)

    def start(self) -> None:
        """Start everything and wait until all are ready; on any failure stop what started and raise."""
        self.write_state()
        try:
            # The router last: it should not answer before there is an instance to route to.
            groups = [[m for m in self.procs if m.spec.kind == k] for k in ("metadata", "vllm", "router")]
            groups[1] += [m for m in self.procs if m.spec.kind not in ("metadata", "vllm", "router")]
            for group in groups:
                for m in group:
                    self._spawn(m)
                    pid = m.proc.pid if m.proc else "?"
                    self.say(f"serve: started {m.spec.name} (pid {pid}), log {m.spec.log_file}")
                self._wait_ready(group)
        except BaseException:
            self.state = "failed"
            self.stop()
            raise
        self.state = "ready"
        self.write_state()

    def step(self) -> None:
        """One monitoring pass: notice exits, schedule and perform restarts."""
        now = time.monotonic()
        changed = False
        for m in self.procs:
            if m.status in ("failed", "stopped"):
                continue
            if m.status == "restarting":
                if now >= m.next_start:
                    self._spawn(m)
                    self.say(f"serve: restarted {m.spec.name} (restart {m.restarts}/{self.max_restarts})")
                continue
            if m.proc is None:
                continue
            code = m.proc.poll()
            if code is None:
                if m.status == "starting" and (m.spec.health_url is None or http_ok(m.spec.health_url)):
                    m.status = "ready"
                    changed = True
                continue
            # It exited on its own: reap its group, then restart or give up.
            terminate_group(m.proc.pid, grace_s=1.0)
            if m.restarts >= self.max_restarts:
                m.status = "failed"
                self.say(
                    f"serve: ERROR: {m.spec.name} exited with status {code} and was restarted {m.restarts} times: "
                    f"giving up on it. Last log lines:\n{log_tail(m.spec.log_file)}"
                )
            else:
                m.restarts += 1
                delay = self.backoff_s * (2 ** (m.restarts - 1))
                m.status = "restarting"
                m.next_start = now + delay
                self.say(f"serve: {m.spec.name} exited with status {code}; restarting in {delay:.0f} s")
            changed = True
        if changed:
            self.write_state()

    def run(self) -> int:
        """Supervise until SIGINT/SIGTERM; then stop everything. Returns the exit code."""
        while not self._stop_requested:
            self.step()
            time.sleep(self.poll_s)
        self.say("serve: stopping")
        self.stop()
        return int(ExitCode.OK)

    def stop(self) -> None:
        """The router first (it drains), workers next (they hold leases and reservations), then the server."""
        self.state = "stopping"
        for kind in ("router", "vllm", "metadata"):
            for m in self.procs:
                if m.spec.kind == kind and m.proc is not None:
                    grace = m.spec.stop_grace_s if m.spec.stop_grace_s is not None else self.stop_grace_s
                    terminate_group(m.proc.pid, grace_s=grace, sig=m.spec.stop_signal)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        m.proc.wait(timeout=1)
                    m.status = "stopped"
        for m in self.procs:
            if m.log is not None:
                m.log.close()
                m.log = None
        self.state = "stopped"
        with contextlib.suppress(OSError):
            self.write_state()
