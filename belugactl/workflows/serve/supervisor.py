"""Run a ServePlan: start in order, wait for readiness, restart crashes with backoff, stop cleanly.

Order: the metadata server first (its `/readyz`), then every vLLM instance (their `/health`).
Each process runs in its own session (process group) so a stop reaches vLLM's engine and worker
children too. A process that dies after it was ready is restarted after 1, 2, 4, ... seconds; after
`max_restarts` it is given up on, loudly, and the rest keep serving. A process that dies or times
out BEFORE it was ever ready fails the start: everything started is stopped, nothing is left running.
State (pids, ports, status, restarts) is kept in `<run_dir>/state.json` for `status` and `stop`.
Every process is recorded with its identity (pid, start time, command line: proc_identity.py) and
nothing is signalled that does not match it; a process that has exited is listed without a pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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

from belugactl.errors import BelugaError, EnvironmentProblem, ExitCode, set_interrupt_note
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.proc_identity import ProcessIdentity, terminate
from belugactl.workflows.serve.run_dir import hold_mark, open_log, prepare_run_dir, write_private

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


def readiness(url: str | None, *, standby_ok: bool = False, timeout: float = 1.0) -> str | None:
    """`ready` (2xx), `standby: X leads` (a metadata server elected through etcd that stands by while X
    leads: its /readyz is 503 with that reason, and serve takes it as healthy when `standby_ok`), else None.
    A standby that knows no leader yet (campaigning, or etcd unreachable) is not yet healthy."""
    if url is None:
        return "ready"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - our own loopback URLs
            return "ready" if 200 <= resp.status < 300 else None
    except urllib.error.HTTPError as exc:
        if not standby_ok or exc.code != 503:
            return None
        try:
            body = json.loads(exc.read(4096))
        except (OSError, ValueError):
            return None
        reason = body.get("reason") if isinstance(body, dict) else None
        found = re.match(r"standby: (\S.*?) leads(?: \(.*\))?$", reason) if isinstance(reason, str) else None
        return f"standby: {found.group(1)} leads" if found else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def http_json(url: str, timeout: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def log_tail(path: str, lines: int = 15) -> str:
    """The last `lines` non-blank-edged lines of a log ("" when it is empty or unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:]).strip("\n")


def exit_why(what: str, log_file: str, lines: int = 15) -> str:
    """A `why` that always says something: what happened, then the log's last lines if it has any."""
    tail = log_tail(log_file, lines)
    if not tail.strip():
        return f"{what}; its log {log_file} is empty"
    return f"{what}; the last lines of {log_file}:\n{tail}"


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


@dataclass
class Managed:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes] | None = None
    status: str = "pending"  # pending | starting | ready | restarting | failed | stopped
    restarts: int = 0
    ever_ready: bool = False
    next_start: float = 0.0
    log: IO[bytes] | None = None
    identity: ProcessIdentity | None = None  # of the process started last; kept after it exits

    @property
    def live(self) -> bool:
        """Started and not yet reaped: while unreaped, its pid cannot belong to anything else."""
        return self.proc is not None and self.proc.returncode is None

    def to_dict(self) -> dict[str, Any]:
        live = self.live and self.status not in ("stopped", "failed")
        return {
            "name": self.spec.name,
            "kind": self.spec.kind,
            # Only a live process is listed with a pid: a later `stop` must not find a number that is
            # someone else's by then. last_pid stays for the operator reading logs.
            "pid": self.proc.pid if live and self.proc else None,
            "identity": self.identity.to_dict() if live and self.identity else None,
            "last_pid": self.proc.pid if self.proc else None,
            "port": self.spec.port,
            "health_url": self.spec.health_url,
            "standby_ok": self.spec.standby_ok,
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
        connector_timeout_s: float = 15.0,
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
        self.identity = ProcessIdentity.of(os.getpid())
        self.connector_timeout_s = connector_timeout_s
        self.connectors: dict[str, dict[str, Any]] = {}  # instance -> connector_report.summarize()
        self._mark: int | None = None  # supervisor.lock, held open while this supervisor runs (run_dir.py)

    # -- state file -------------------------------------------------------------------------
    def write_state(self) -> None:
        running = self.state not in ("stopped", "failed")
        doc = {
            # once stopped, no pid: whoever gets this number next is not ours to signal
            "supervisor_pid": os.getpid() if running else None,
            "supervisor": self.identity.to_dict() if running and self.identity else None,
            "state": self.state,
            "updated": time.time(),
            **{k: v for k, v in self.plan.to_dict().items() if k != "processes"},
            "processes": [m.to_dict() for m in self.procs],
            "connectors": self.connectors,
        }
        if not self.run_dir.exists():
            prepare_run_dir(self.run_dir)
        write_private(self.run_dir / STATE_FILE, json.dumps(doc, indent=2).encode())

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
            m.log = open_log(Path(m.spec.log_file))  # kept open for the child's lifetime
        m.log.write(f"\n=== belugactl serve: starting {m.spec.name}: {' '.join(m.spec.argv)}\n".encode())
        m.log.flush()
        for path, text in m.spec.files:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_private(Path(path), text.encode())
        if m.spec.tenant_key is not None:  # its tenant's key only, derived from the rack secret (rpc/auth.py)
            from belugactl.dataplane.rpc.auth import tenant_key_file_text

            key_file, secret_file, tenant = m.spec.tenant_key
            Path(key_file).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(Path(key_file), tenant_key_file_text(secret_file, tenant).encode())
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
        # Read before anything can reap it: an unreaped child's pid cannot be reused meanwhile.
        m.identity = ProcessIdentity.of(m.proc.pid)
        m.status = "starting"
        self.write_state()

    def _terminate(self, m: Managed, grace_s: float, sig: int = signal.SIGTERM) -> None:
        """Stop m's process group: through its recorded identity, never a bare pid."""
        if m.proc is None:
            return
        if m.identity is None and m.live:
            # It exited (and turned zombie) before its identity could be read: still ours, unreaped.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(m.proc.pid, signal.SIGKILL)
            return
        terminate(m.identity, grace_s=grace_s, sig=sig)

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
                        why=exit_why(f"{m.spec.name} exited with status {code}", m.spec.log_file),
                        fix=f"read {m.spec.log_file}",
                    )
                ready = readiness(m.spec.health_url, standby_ok=m.spec.standby_ok)
                if ready is not None:
                    m.status = "ready"
                    m.ever_ready = True
                    waiting.remove(m)
                    port = f" on port {m.spec.port}" if m.spec.port else ""
                    what = "ready" if ready == "ready" else f"is a standby ({ready})"
                    self.say(f"serve: {m.spec.name} {what}{port}")
                    self.write_state()
                elif time.monotonic() > deadline[m.spec.name]:
                    raise StartFailed(
                        f"{m.spec.name} was not ready within {m.spec.ready_timeout_s:.0f} s ({m.spec.health_url})",
                        why=exit_why(
                            f"{m.spec.health_url} did not answer 200"
                            + (" nor name a leader as a standby" if m.spec.standby_ok else ""),
                            m.spec.log_file,
                        ),
                        fix=f"read {m.spec.log_file}",
                    )
            time.sleep(self.poll_s)

    def start(self) -> None:
        """Start everything and wait until all are ready; on any failure stop what started and raise."""
        prepare_run_dir(self.run_dir)  # this user's, nobody else's to write (run_dir.py)
        if self._mark is None:
            self._mark = hold_mark(self.run_dir)
        self.write_state()
        try:
            # The router last: it should not answer before there is an instance to route to.
            # etcd before the metadata server, which campaigns in it.
            order = ("etcd", "metadata", "vllm", "router")
            groups = [[m for m in self.procs if m.spec.kind == k] for k in order]
            groups[2] += [m for m in self.procs if m.spec.kind not in order]
            for group in groups:
                for m in group:
                    self._spawn(m)
                    pid = m.proc.pid if m.proc else "?"
                    self.say(f"serve: started {m.spec.name} (pid {pid}), log {m.spec.log_file}")
                self._wait_ready(group)
        except BaseException:
            self.state = "failed"
            self.stop()
            started = sum(m.proc is not None for m in self.procs)
            set_interrupt_note(f"serve stopped the {started} process(es) it had started")
            raise
        self.check_connectors()
        self.state = "ready"
        self.write_state()

    def check_connectors(self) -> None:
        """Say loudly which instances' connectors did not reach the metadata server (the cache is off there)."""
        from belugactl.workflows.serve.connector_report import wait_for_connectors

        instances = {m.spec.name: m.spec.stats_prefix for m in self.procs if m.spec.kind == "vllm"}
        watched = {name: prefix for name, prefix in instances.items() if prefix}
        if not watched:
            return
        self.connectors = wait_for_connectors(watched, timeout_s=self.connector_timeout_s)
        for name, entry in self.connectors.items():
            if entry["connected"] is True:
                continue
            level = "WARNING" if entry["connected"] is False else "note"
            self.say(
                f"serve: {level}: {name}'s KV connector "
                + ("did not reach" if entry["connected"] is False else "has not yet reported reaching")
                + f" the metadata server ({entry['why']}): it serves without the pool until it does. "
                f"Check the server's log and the instance's log ({self._log_of(name)}); `belugactl status` tracks it"
            )

    def _log_of(self, name: str) -> str:
        return next(m.spec.log_file for m in self.procs if m.spec.name == name)

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
                if m.status == "starting" and readiness(m.spec.health_url, standby_ok=m.spec.standby_ok):
                    m.status = "ready"
                    changed = True
                continue
            # It exited on its own: stop what is left of its group, then restart or give up.
            self._terminate(m, grace_s=1.0)
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
        """The router first (it drains), workers next (they hold leases and reservations), then the server,
        then etcd (the server resigns its lease in it as it stops)."""
        self.state = "stopping"
        for kind in ("router", "vllm", "metadata", "etcd"):
            for m in self.procs:
                if m.spec.kind == kind and m.proc is not None:
                    grace = m.spec.stop_grace_s if m.spec.stop_grace_s is not None else self.stop_grace_s
                    self._terminate(m, grace, sig=getattr(signal, m.spec.stop_signal))
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
        if self._mark is not None:
            os.close(self._mark)
            self._mark = None
