"""Entry points the CLI calls: prepare a plan for this host, read status, stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.errors import EnvironmentProblem, InputError, UsageError
from belugactl.pool.device import is_device
from belugactl.workflows.serve import preflight
from belugactl.workflows.serve.connector_report import read_connector_stats, summarize
from belugactl.workflows.serve.launch_plan import ServePlan, Tools, build_serve_plan
from belugactl.workflows.serve.proc_identity import ProcessIdentity, is_running, signal_process, terminate
from belugactl.workflows.serve.router import add_router, check_router
from belugactl.workflows.serve.run_dir import (
    SUPERVISOR_MARK,
    check_state_file,
    holds_file,
    prepare_run_dir,
    write_private,
)
from belugactl.workflows.serve.supervisor import STATE_FILE, http_json, pid_alive, readiness

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext


def default_run_dir() -> Path:
    """$BELUGACTL_RUN_DIR, else one per user (workflows/serve/sharing.py)."""
    from belugactl.workflows.serve.sharing import per_user_run_dir

    return per_user_run_dir()


@dataclass
class Prepared:
    plan: ServePlan
    doctor_ignored: list[str] = field(default_factory=list)


def prepare(
    rack: RackContext,
    *,
    run_dir: str | None = None,
    vllm: str | None = None,
    check: bool = True,
    ignore_checks: Iterable[str] = (),
    skip_doctor: bool = False,
    create_pool: bool = False,
) -> Prepared:
    """Build this host's plan from the rack context and, with `check`, run every preflight check."""
    host = rack.host()
    pool = rack.pool_path()
    snapshot = None
    is_file_pool = not is_device(pool)
    if host.platform == "gpu" or (check and not skip_doctor and not is_file_pool):
        with contextlib.suppress(Exception):  # discovery is best effort for NUMA placement
            from belugactl.host.host import Host
            from belugactl.workflows.discover import discover

            snapshot = discover(Host.local())
    plan = build_serve_plan(rack, run_dir=run_dir or default_run_dir(), tools=Tools.find(vllm), snapshot=snapshot)
    add_router(plan, rack.manifest)  # the front door, where serve.router puts it
    plan.notes += preflight.exposure_warnings(rack, plan)  # said on every start and in --dry-run
    prepared = Prepared(plan)
    if not check:
        return prepared
    if plan.blockers:
        raise InputError(
            f"serve on {plan.host}: the manifest cannot work as written",
            why="\n".join(plan.blockers),
            fix="change the manifest as said above; `belugactl serve --dry-run` shows the plan",
        )
    prepare_run_dir(plan.run_dir)  # refused (exit 2) when another user could write it
    _check_not_running(Path(plan.run_dir))
    preflight.check_vllm(plan)
    check_router(plan)
    manifest = rack.manifest
    if manifest.serve is not None and manifest.instances_on(host):
        from belugactl.workflows.serve.launch_plan import resolve_model

        preflight.check_model(resolve_model(manifest.serve.vllm.model, rack.path), manifest_path=rack.file)
    preflight.check_ports(
        (p.name, p.port, preflight.listen_address(p.health_url)) for p in plan.processes if p.port is not None
    )
    if any(p.kind == "metadata" for p in plan.processes) and manifest.serve is not None:
        preflight.check_ports([("metadata-server rpc", manifest.serve.metadata.rpc_port)])
    if create_pool and not is_file_pool:
        raise UsageError("--create-pool makes file pools only", fix="provision a device pool with belugactl setup")
    if create_pool and not Path(pool).exists():
        from belugactl.pool.file_pool import create_file_pool

        create_file_pool(pool, manifest, layout=rack.layout)
        plan.notes.append(f"created the file pool {pool}")
    preflight.check_pool(pool, rack)
    if is_file_pool:
        plan.notes.append("file-backed pool (development): doctor's CXL checks do not apply and were not run")
    elif not skip_doctor:
        from belugactl.host.host import Host
        from belugactl.workflows.doctor.workflow import run_doctor

        report = run_doctor(Host.local(), rack=rack, snapshot=snapshot)
        prepared.doctor_ignored = preflight.check_doctor(report, ignore=ignore_checks)
    return prepared


def read_state(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_trusted_state(run_dir: str | Path) -> dict[str, Any] | None:
    """The state file, when there is one that only this user could have written (else exit 2)."""
    path = Path(run_dir) / STATE_FILE
    if not os.path.lexists(path):
        return None
    check_state_file(path)
    return read_state(run_dir)


def _started_here(run: Path, name: str, identity: ProcessIdentity, entry: dict[str, Any] | None) -> str | None:
    """Why the running process `identity` is not provably one serve started from this run dir (None: it is).

    Its identity can be copied from /proc; a file of this run dir held open cannot (run_dir.py)."""
    if entry is None:  # the supervisor: it holds supervisor.lock
        held = holds_file(identity.pid, run / SUPERVISOR_MARK)
        what = f"{run / SUPERVISOR_MARK} open"
    else:  # a child: its stdout and stderr are its log in this run dir
        log = entry.get("log_file")
        if not isinstance(log, str) or not Path(os.path.realpath(log)).is_relative_to(os.path.realpath(run)):
            return f"{name} (pid {identity.pid}): its log {log!r} is not in the run dir {run}"
        # stdout and stderr first; any fd after (a library may point fd 1 elsewhere for a while, keeping a dup)
        held = holds_file(identity.pid, Path(log), fds=(1, 2)) or holds_file(identity.pid, Path(log))
        what = f"its log {log} open"
    if held:
        return None
    cannot = "cannot be read" if held is None else "does not hold"
    return f"{name} (pid {identity.pid}, {' '.join(identity.cmdline)[:80]}): /proc/{identity.pid}/fd {cannot} {what}"


def _recorded(entry: Any) -> ProcessIdentity | None:
    """The identity a state-file entry recorded (None for a dead process or an older state file)."""
    return ProcessIdentity.from_dict(entry.get("identity") if isinstance(entry, dict) else None)


def _supervisor(state: dict[str, Any]) -> ProcessIdentity | None:
    return ProcessIdentity.from_dict(state.get("supervisor"))


def _check_not_running(run_dir: Path) -> None:
    state = read_state(run_dir)
    # An older state file has a bare pid: refusing to start on a live one is the safe side.
    legacy = state is not None and _supervisor(state) is None and pid_alive(state.get("supervisor_pid"))
    if state and state.get("state") not in ("stopped", "failed") and (is_running(_supervisor(state)) or legacy):
        raise EnvironmentProblem(
            f"serve is already running here (supervisor pid {state['supervisor_pid']}, run dir {run_dir})",
            fix="`belugactl status` to see it, `belugactl stop` to stop it",
        )


def status(run_dir: str | Path | None = None) -> dict[str, Any]:
    """What serve started: processes (alive, health), ports, and pool usage from the server's /stats."""
    run = Path(run_dir) if run_dir else default_run_dir()
    state = read_trusted_state(run)
    if state is None:
        return {"run_dir": str(run), "running": False, "state": "not started", "processes": []}
    supervisor_alive = is_running(_supervisor(state))
    procs = []
    for p in state.get("processes", []):
        alive = is_running(_recorded(p))
        # An elected metadata server standing by while another leads is healthy: its role says which.
        role = readiness(p["health_url"], standby_ok=bool(p.get("standby_ok")), timeout=1.0) if alive else None
        healthy = bool(alive and p.get("health_url") and role)
        entry = {**p, "alive": alive, "healthy": healthy}
        if p.get("standby_ok"):
            entry["role"] = "leader" if role == "ready" else "standby" if role else None
        if p.get("stats_prefix"):
            entry["connector"] = read_connector_stats(p["stats_prefix"])
            # connected / hits / saves / load errors, None where nothing reports it
            entry["cache"] = summarize(entry["connector"])
        procs.append(entry)
    pool = None
    if state.get("metadata_admin_url") and supervisor_alive:
        pool = pool_summary(http_json(f"{state['metadata_admin_url']}/stats", timeout=1.0))
    running = supervisor_alive and state.get("state") in ("starting", "ready")
    recorded = state.get("state")
    if not supervisor_alive and recorded not in ("stopped", "failed"):
        recorded = "supervisor gone"  # killed without a chance to stop its processes: `stop` cleans up
    return {
        "run_dir": str(run),
        "running": running,
        "state": recorded,
        "supervisor_pid": state.get("supervisor_pid"),
        "rack": state.get("rack"),
        "host": state.get("host"),
        "pool_path": state.get("pool_path"),
        "processes": procs,
        "pool": pool,
    }


def pool_summary(stats: Any) -> dict[str, Any] | None:
    """The pool's usage from the metadata server's /stats document."""
    if not isinstance(stats, dict):
        return None
    index = stats.get("index") if isinstance(stats.get("index"), dict) else stats
    capacity = index.get("bytes_capacity") or 0
    used = index.get("bytes_used") or 0
    lead = stats.get("leadership") if isinstance(stats.get("leadership"), dict) else {}
    return {
        "epoch": stats.get("epoch"),
        "ready": stats.get("ready"),
        "entries": index.get("entries"),
        "bytes_used": used,
        "bytes_capacity": capacity,
        "used_fraction": round(used / capacity, 4) if capacity else None,
        "evictions": index.get("evictions"),
        "hits": index.get("hits"),
        "misses": index.get("misses"),
        # An elected server (metadata-server --standby): who leads, since when (epoch s), leader changes seen
        "leader": lead.get("leader"),
        "leader_since": lead.get("leader_since"),
        "leader_changes": lead.get("leader_changes"),
        "member": lead.get("member"),  # this server's member name, and whether it leads
        "leading": lead.get("leading"),
    }


def stop(run_dir: str | Path | None = None, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Ask the supervisor to stop (SIGTERM) and wait; stop orphans directly if it is gone.

    Nothing running (no state, or everything already stopped) is not an error: `stopped` is empty
    and `nothing_running` true. Only processes whose recorded identity still matches are signalled.
    """
    run = Path(run_dir) if run_dir else default_run_dir()
    state = read_trusted_state(run)
    if state is None:
        return {"run_dir": str(run), "stopped": [], "nothing_running": True, "skipped": []}
    sup = _supervisor(state)
    _refuse_unproven(run, state)
    stopped: list[str] = []
    skipped = _unverifiable(state)
    try:
        asked = is_running(sup) and signal_process(sup, signal.SIGTERM)
    except PermissionError:
        assert sup is not None
        raise EnvironmentProblem(
            f"cannot signal the serve supervisor (pid {sup.pid}): permission denied",
            why="serve was started by another user (or root)",
            fix="run `belugactl stop` as the user that ran serve",
        ) from None
    if asked:
        assert sup is not None
        deadline = time.monotonic() + timeout_s
        while is_running(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        if is_running(sup):
            raise EnvironmentProblem(
                f"the serve supervisor (pid {sup.pid}) did not stop within {timeout_s:.0f} s",
                why="it is still running after SIGTERM (a process that ignores SIGTERM?)",
                fix=f"kill -TERM {sup.pid}; its processes are listed in {run / STATE_FILE}",
            )
        stopped.append("supervisor")
    # Whatever is still alive (a supervisor killed with SIGKILL leaves its children behind).
    state = read_trusted_state(run) or state
    _refuse_unproven(run, state)
    for kind in ("router", "vllm", "metadata", "etcd"):
        for p in state.get("processes", []):
            if (
                p.get("kind") == kind
                and is_running(_recorded(p))
                and terminate(_recorded(p), sig=getattr(signal, p.get("stop_signal", "SIGTERM")))
            ):
                stopped.append(p["name"])
    _record_stopped(run, state)
    return {"run_dir": str(run), "stopped": stopped, "nothing_running": not stopped, "skipped": skipped}


def _refuse_unproven(run: Path, state: dict[str, Any]) -> None:
    """Before any signal: every running process the state names must be provably serve's, else exit 2."""
    problems = []
    sup = _supervisor(state)
    if is_running(sup):
        assert sup is not None
        problems.append(_started_here(run, "supervisor", sup, None))
    for p in state.get("processes", []):
        identity = _recorded(p)
        if identity is not None and is_running(identity):
            problems.append(_started_here(run, str(p.get("name")), identity, p))
    found = [x for x in problems if x is not None]
    if found:
        raise InputError(
            f"stop: refusing to signal anything: the state file {run / STATE_FILE} names running processes "
            "that serve did not start from this run dir",
            why="\n".join(found) + "\n(an identity copied from /proc matches; the run dir's files held open do not)",
            fix="check them with `ps -o pid,user,args -p PID`; stop serve's own processes by hand and remove the "
            "state file",
        )


def _unverifiable(state: dict[str, Any]) -> list[str]:
    """Entries with a pid but no identity (an older state file): never signalled, named in the result."""
    out = []
    if state.get("supervisor_pid") and _supervisor(state) is None:
        out.append(f"supervisor (pid {state['supervisor_pid']})")
    for p in state.get("processes", []):
        if isinstance(p, dict) and p.get("pid") and _recorded(p) is None:
            out.append(f"{p.get('name')} (pid {p['pid']})")
    return out


def _record_stopped(run: Path, state: dict[str, Any]) -> None:
    """Rewrite the state file so it lists no pid of a process that is gone (a later `stop` finds none)."""
    if is_running(_supervisor(state)) or _unverifiable(state):
        return  # the supervisor owns the file while it runs; an older file's pids stay for the operator
    changed = False
    for p in state.get("processes", []):
        if isinstance(p, dict) and (p.get("pid") or p.get("identity")) and not is_running(_recorded(p)):
            p["last_pid"] = p.get("pid") or p.get("last_pid")
            p["pid"], p["identity"] = None, None
            p["status"] = "stopped" if p.get("status") not in ("failed",) else p["status"]
            changed = True
    if state.get("supervisor_pid") or state.get("supervisor") or state.get("state") not in ("stopped", "failed"):
        state["supervisor_pid"], state["supervisor"] = None, None
        if state.get("state") != "failed":
            state["state"] = "stopped"
        changed = True
    if changed:
        with contextlib.suppress(OSError):
            write_private(run / STATE_FILE, json.dumps(state, indent=2).encode())
