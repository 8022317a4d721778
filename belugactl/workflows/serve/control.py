"""Entry points the CLI calls: prepare a plan for this host, read status, stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.errors import EnvironmentProblem, InputError, UsageError
from belugactl.workflows.serve import preflight
from belugactl.workflows.serve.plan import ServePlan, Tools, build_serve_plan
from belugactl.workflows.serve.router import add_router, check_router
from belugactl.workflows.serve.supervisor import STATE_FILE, http_json, http_ok, pid_alive, terminate_group


def default_run_dir() -> Path:
    """$BELUGACTL_RUN_DIR, else one per user (workflows/serve/sharing.py)."""
    from belugactl.workflows.serve.sharing import per_user_run_dir

    return per_user_run_dir()


def default_pool_path(manifest: Any) -> str:
    source = manifest.pool.source
    if getattr(source, "kind", None) == "dax-device":
        device = source.device
        return device if device.startswith("/") else f"/dev/{device}"
    # A region-backed pool becomes one devdax device per host; setup names it after the namespace.
    return "/dev/dax0.0"


@dataclass
class Prepared:
    plan: ServePlan
    doctor_ignored: list[str] = field(default_factory=list)


def prepare(
    manifest_path: str,
    *,
    host_name: str | None = None,
    pool_path: str | None = None,
    run_dir: str | None = None,
    vllm: str | None = None,
    check: bool = True,
    ignore_checks: Iterable[str] = (),
    skip_doctor: bool = False,
    create_pool: bool = False,
) -> Prepared:
    """Load the manifest, pick this host, build the plan and, with `check`, run every preflight check."""
    from belugactl.model.layout import resolve_layout
    from belugactl.model.manifest import load_manifest

    manifest = load_manifest(manifest_path)
    # Children run with other working directories; hand them absolute paths.
    manifest_path = str(Path(manifest_path).resolve())
    host = _pick_host(manifest, host_name, manifest_path)
    layout = resolve_layout(manifest)
    pool = pool_path or default_pool_path(manifest)
    if not pool.startswith("/dev/"):
        pool = str(Path(pool).resolve())
    snapshot = None
    is_file_pool = not pool.startswith("/dev/")
    if host.platform == "gpu" or (check and not skip_doctor and not is_file_pool):
        with contextlib.suppress(Exception):  # discovery is best effort for NUMA placement
            from belugactl.host.host import Host
            from belugactl.workflows.discover import discover

            snapshot = discover(Host.local())
    plan = build_serve_plan(
        manifest,
        layout,
        manifest_path=manifest_path,
        host_name=host.name,
        pool_path=pool,
        run_dir=run_dir or default_run_dir(),
        tools=Tools.find(vllm),
        snapshot=snapshot,
    )
    add_router(plan, manifest)  # the front door, where serve.router puts it
    prepared = Prepared(plan)
    if not check:
        return prepared
    if plan.blockers:
        raise InputError(
            f"serve on {plan.host}: the manifest cannot work as written",
            why="\n".join(plan.blockers),
            fix="change the manifest as said above; `belugactl serve --dry-run` shows the plan",
        )
    _check_not_running(Path(plan.run_dir))
    preflight.check_vllm(plan)
    check_router(plan)
    if manifest.serve is not None and manifest.instances_on(host):
        from belugactl.workflows.serve.plan import resolve_model

        preflight.check_model(resolve_model(manifest.serve.vllm.model, manifest_path), manifest_path=manifest_path)
    preflight.check_ports((p.name, p.port) for p in plan.processes if p.port is not None)
    if any(p.kind == "metadata" for p in plan.processes) and manifest.serve is not None:
        preflight.check_ports([("metadata-server rpc", manifest.serve.metadata.rpc_port)])
    if create_pool and not is_file_pool:
        raise UsageError("--create-pool makes file pools only", fix="provision a device pool with belugactl setup")
    if create_pool and not Path(pool).exists():
        from belugactl.dataplane.pool import create_file_pool

        create_file_pool(pool, manifest_path)
        plan.notes.append(f"created the file pool {pool}")
    preflight.check_pool(pool, manifest_path)
    if is_file_pool:
        plan.notes.append("file-backed pool (development): doctor's CXL checks do not apply and were not run")
    elif not skip_doctor:
        from belugactl.host.host import Host
        from belugactl.workflows.doctor.workflow import run_doctor

        report = run_doctor(Host.local(), manifest_path=manifest_path, host_name=host.name, snapshot=snapshot)
        prepared.doctor_ignored = preflight.check_doctor(report, ignore=ignore_checks)
    return prepared


def _pick_host(manifest: Any, wanted: str | None, manifest_path: str) -> Any:
    if wanted is None and len(manifest.hosts) == 1:
        return manifest.hosts[0]
    from belugactl.workflows.doctor.expectations import pick_host

    return pick_host(manifest, wanted, socket.gethostname(), file=manifest_path)


def read_state(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _check_not_running(run_dir: Path) -> None:
    state = read_state(run_dir)
    if state and state.get("state") not in ("stopped", "failed") and pid_alive(state.get("supervisor_pid")):
        raise EnvironmentProblem(
            f"serve is already running here (supervisor pid {state['supervisor_pid']}, run dir {run_dir})",
            fix="`belugactl status` to see it, `belugactl stop` to stop it",
        )


def status(run_dir: str | Path | None = None) -> dict[str, Any]:
    """What serve started: processes (alive, health), ports, and pool usage from the server's /stats."""
    run = Path(run_dir) if run_dir else default_run_dir()
    state = read_state(run)
    if state is None:
        return {"run_dir": str(run), "running": False, "state": "not started", "processes": []}
    supervisor_alive = pid_alive(state.get("supervisor_pid"))
    procs = []
    for p in state.get("processes", []):
        alive = pid_alive(p.get("pid"))
        healthy = bool(alive and p.get("health_url") and http_ok(p["health_url"], timeout=1.0))
        entry = {**p, "alive": alive, "healthy": healthy}
        if p.get("stats_prefix"):
            entry["connector"] = _connector_stats(p["stats_prefix"])
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
    }


def _connector_stats(prefix: str) -> dict[str, Any]:
    base = Path(prefix)
    out: dict[str, Any] = {}
    for path in sorted(base.parent.glob(base.name + ".*.json")):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
            out[str(doc.get("role", path.name))] = doc
    return out


def stop(run_dir: str | Path | None = None, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Ask the supervisor to stop (SIGTERM) and wait; stop orphans directly if it is gone."""
    run = Path(run_dir) if run_dir else default_run_dir()
    state = read_state(run)
    if state is None:
        raise UsageError(f"nothing to stop: no serve state in {run}", fix="pass --run-dir if serve used another one")
    sup = state.get("supervisor_pid")
    stopped: list[str] = []
    if pid_alive(sup):
        with contextlib.suppress(ProcessLookupError):
            os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(sup):
            raise EnvironmentProblem(
                f"the serve supervisor (pid {sup}) did not stop within {timeout_s:.0f} s",
                fix=f"kill -TERM {sup}; its processes are listed in {run / STATE_FILE}",
            )
        stopped.append("supervisor")
    # Whatever is still alive (a supervisor killed with SIGKILL leaves its children behind).
    state = read_state(run) or state
    for kind in ("router", "vllm", "metadata"):
        for p in state.get("processes", []):
            if p.get("kind") == kind and pid_alive(p.get("pid")):
                terminate_group(p["pid"], sig=p.get("stop_signal", "SIGTERM"))
                stopped.append(p["name"])
    return {"run_dir": str(run), "stopped": stopped}
