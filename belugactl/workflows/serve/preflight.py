"""Checks before `serve` starts anything: each failure is one clear error, and nothing is left running.

Missing vLLM or the connector plugin, a busy port, an unprovisioned pool: exit 3 (environment).
A model path that does not exist, a pool whose header disagrees with the manifest: exit 2 (input).
Doctor failures that would break serving: exit 1, naming the checks, unless ignored.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from belugactl.errors import EnvironmentProblem, InputError, StepFailed
from belugactl.workflows.serve.launch_plan import ServePlan

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext

# Doctor topics whose failures break a pool-backed vLLM on a devdax pool. On a file pool (development)
# the CXL stack is not in the path at all, so the gate does not apply.
SERVING_CHECK_PREFIXES = ("dax.", "cxl.", "numa.", "mtrr.", "ddio.", "pool.", "memory.")


def is_loopback(bind: str) -> bool:
    """Whether a listener bound to `bind` answers only on this host."""
    import ipaddress

    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False  # a DNS name (or nothing: every address): assume it reaches the network


def exposure_warnings(rack: RackContext, plan: ServePlan | None = None) -> list[str]:
    """One warning per listener this host's serve would open beyond loopback (the manifest asked for it,
    but nothing there authenticates a caller: vLLM's API, the router, the metadata server's admin).
    The router's is said when `plan` (with the router added) runs it here."""
    from belugactl.workflows.serve.launch_plan import metadata_host, vllm_bind

    manifest, host = rack.manifest, rack.host()
    if manifest.serve is None:
        return []
    serve = manifest.serve
    out = []
    if manifest.instances_on(host):
        bind, passed = vllm_bind(manifest, host)
        if not is_loopback(bind):
            where = "serve.vllm.extra_args --host" if not passed else f"hosts[].address of {host.name} (serve.router)"
            what = "every address" if bind in ("0.0.0.0", "::", "") else bind
            out.append(
                f"WARNING: vLLM listens on {what} ({where}), beyond loopback: anyone who reaches it can use the "
                "model's API without a credential; firewall it to the router's hosts"
            )
    mds = metadata_host(manifest)
    if mds is not None and mds.name == host.name:
        for field, bind in (("admin_bind", serve.metadata.admin_bind), ("rpc_bind", serve.metadata.rpc_bind)):
            if not is_loopback(bind):
                out.append(
                    f"WARNING: the metadata server's {field} is {bind}, beyond loopback: "
                    "firewall it to this rack's hosts"
                )
    runs_router = plan is not None and any(p.kind == "router" for p in plan.processes)
    if serve.router is not None and runs_router:
        bind = serve.router.bind_on(host)
        if not is_loopback(bind):
            out.append(f"WARNING: the router binds {bind} (serve.router.bind), beyond loopback")
    return out


def check_vllm(plan: ServePlan) -> None:
    vllm_specs = [p for p in plan.processes if p.kind == "vllm"]
    if not vllm_specs:
        return
    argv0 = vllm_specs[0].argv
    program = next(a for a in argv0 if not a.startswith("--") and Path(a).name != "numactl")
    if not (os.path.isabs(program) and os.access(program, os.X_OK)) and not _which(program):
        raise EnvironmentProblem(
            f"vLLM is not installed: {program} not found",
            why="serve runs `vllm serve` for each instance",
            fix="run scripts/bootstrap-vllm (creates .venv-vllm with vLLM and the Beluga plugin), or pass --vllm PATH",
        )
    python = Path(program).resolve().parent / "python"
    if python.exists():
        probe = subprocess.run(  # noqa: S603 - fixed argv
            [str(python), "-c", "import vllm_beluga.plugin"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if probe.returncode != 0:
            last = (probe.stderr.decode(errors="replace").strip().splitlines() or ["import vllm_beluga failed"])[-1]
            raise EnvironmentProblem(
                f"the Beluga connector plugin is not installed next to {program}",
                why=last,
                fix=f"{python} -m pip install -e plugins/vllm_beluga (scripts/bootstrap-vllm does it)",
            )


def _which(program: str) -> str | None:
    import shutil

    return shutil.which(program)


def check_model(model: str, *, manifest_path: str) -> None:
    """A local path must exist; a hub id (org/name) cannot be checked offline and is left to vLLM."""
    looks_local = model.startswith(("/", "./", "../", "~")) or Path(model).exists()
    if looks_local and not Path(os.path.expanduser(model)).is_dir():
        raise InputError(
            f"model {model} does not exist",
            why=f"serve.vllm.model in {manifest_path} names a local path",
            fix="fix serve.vllm.model, or copy the model there (a dir with config.json and weights)",
        )


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def listen_address(health_url: str | None) -> str:
    """Where a process's listener is checked for a free port: the address its health URL dials (its
    bind, or loopback for a wildcard); 127.0.0.1 without one."""
    from urllib.parse import urlsplit

    host = urlsplit(health_url).hostname if health_url else None
    try:
        return host if host is not None and ipaddress.ip_address(host).version == 4 else "127.0.0.1"
    except ValueError:
        return "127.0.0.1"  # a name: loopback, as before


def check_ports(ports: Iterable[tuple[str, int] | tuple[str, int, str]]) -> None:
    """Refuse ports another process listens on: (name, port) on 127.0.0.1, or (name, port, address)
    on the address the listener will bind (two hosts' listeners on one machine, 127.0.0.1 and
    127.0.0.2, take the same port)."""
    wanted = [(p[0], p[1], p[2] if len(p) > 2 else "127.0.0.1") for p in ports]
    busy = [(name, port) for name, port, address in wanted if not port_free(port, address)]
    if busy:
        what = ", ".join(f"{port} ({name})" for name, port in busy)
        from belugactl.workflows.serve.sharing import port_holders

        holders = port_holders(port for _, port in busy)
        held = "; ".join(f"{port} is held by {holders[port]}" for _, port in busy if port in holders)
        raise EnvironmentProblem(
            f"port{'s' if len(busy) > 1 else ''} in use: {what}",
            why=held or "another process listens there (a previous serve still running?)",
            fix="`belugactl status` / `belugactl stop`, or change serve.vllm.port_base / serve.metadata ports",
        )


def check_pool(pool_path: str, rack: RackContext) -> None:
    from belugactl.pool.mapping import PoolMapping

    if not Path(pool_path).exists():
        raise EnvironmentProblem(
            f"pool {pool_path} is not provisioned",
            why="the metadata server and the vLLM connectors map the pool from this path",
            fix=f"belugactl setup -f {rack.file} (devdax); for development, a file pool: "
            f"belugactl serve -f {rack.file} --pool {pool_path} --create-pool",
        )
    with PoolMapping.open(pool_path, rack.manifest, writable=False, layout=rack.layout):
        pass  # raises PoolMismatch (exit 2) when the header disagrees with the manifest


def check_doctor(report: object, *, ignore: Iterable[str] = ()) -> list[str]:
    """Raise on doctor failures that break serving; return the ids of failures let through."""
    ignored = set(ignore)
    blocking = []
    passed_over = []
    for outcome in getattr(report, "outcomes", ()):
        if str(getattr(outcome.status, "value", outcome.status)) != "fail":
            continue
        if not outcome.id.startswith(SERVING_CHECK_PREFIXES):
            continue
        if outcome.id in ignored or "all" in ignored:
            passed_over.append(outcome.id)
            continue
        blocking.append(outcome)
    if blocking:
        raise StepFailed(
            f"doctor: {len(blocking)} failure{'s' if len(blocking) > 1 else ''} that would break serving: "
            + ", ".join(o.id for o in blocking),
            why="\n".join(
                f"{o.id}: {o.result.reason}" + (f" (fix: {o.result.fix})" if o.result.fix else "") for o in blocking
            ),
            fix="fix them (belugactl setup), or pass --ignore ID for each to serve anyway",
        )
    return passed_over
