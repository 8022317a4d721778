"""`belugactl metadata-server`: run the KV metadata server on this host (serve starts it; runnable alone)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import typer

from belugactl.cli.options import file_option, host_option


def register(app: typer.Typer) -> None:
    app.command("metadata-server")(metadata_server)


def metadata_server(
    file: Path = file_option("Rack manifest (rack.yaml)."),
    pool: str | None = typer.Option(
        None,
        "--pool",
        metavar="PATH",
        help="Pool to map: /dev/daxX.Y or a file pool. Default: the manifest's dax device, or the region "
        "pool's device setup made.",
    ),
    host: str | None = host_option("This machine's host in the manifest (finds a region pool's device)."),
    bind: str | None = typer.Option(
        None,
        "--bind",
        metavar="HOST",
        help="Address for the RPC TCP listener and admin HTTP (default: manifest, else 127.0.0.1).",
    ),
    rpc_bind: str | None = typer.Option(
        None,
        "--rpc-bind",
        metavar="HOST",
        help="Address for the RPC TCP listener only (e.g. the rack address); default --bind.",
    ),
    admin_port: int | None = typer.Option(
        None,
        "--admin-port",
        metavar="PORT",
        min=0,
        max=65535,
        help="Admin HTTP port (default: manifest, 9470; 0: any free port).",
    ),
    rpc_port: int | None = typer.Option(
        None,
        "--rpc-port",
        metavar="PORT",
        min=0,
        max=65535,
        help="TCP RPC port (default: manifest, 9471; 0: any free port).",
    ),
    no_tcp: bool = typer.Option(False, "--no-tcp", help="Serve CXL-RPC only."),
    fence_grace: float = typer.Option(
        0.0,
        "--fence-grace",
        metavar="SECONDS",
        help="Seconds after start during which only HELLO is served. Not needed for safety: RESERVE is "
        "fenced until the previous incarnation's writers' deadlines pass (docs/dataplane.md, Fencing).",
    ),
    tcp_max_connections: int | None = typer.Option(
        None, "--tcp-max-connections", metavar="N", help="TCP connections served at once (default: manifest, 256)."
    ),
    tcp_idle_timeout: float | None = typer.Option(
        None,
        "--tcp-idle-timeout",
        metavar="SECONDS",
        help="Close a TCP connection idle this many seconds (default: manifest, 300).",
    ),
    tcp_max_buffered: str | None = typer.Option(
        None,
        "--tcp-max-buffered",
        metavar="SIZE",
        help="Bytes one TCP connection may buffer (default: manifest, 256KiB).",
    ),
    tcp_accept_backoff_ms: int | None = typer.Option(
        None,
        "--tcp-accept-backoff-ms",
        metavar="MS",
        help="Pause accepting this long when out of descriptors (default: 200).",
    ),
    lease_ttl: float = typer.Option(10.0, "--lease-ttl", metavar="SECONDS", help="Read lease lifetime, seconds."),
    reservation_ttl: float = typer.Option(
        30.0, "--reservation-ttl", metavar="SECONDS", help="Uncommitted reservation lifetime, seconds."
    ),
    high_watermark: float = typer.Option(
        0.90, "--high-watermark", metavar="FRACTION", help="Evict above this fraction of the KV area."
    ),
    low_watermark: float = typer.Option(0.80, "--low-watermark", metavar="FRACTION", help="...down to this fraction."),
    zero_on_free: bool = typer.Option(False, "--zero-on-free", help="Zero freed blocks (multi-tenant pools)."),
    restart_policy: str | None = typer.Option(
        None,
        "--restart-policy",
        metavar="start-empty|journal",
        help="journal or start-empty: rebuild the index from the pool's journal area at start, or start "
        "with an empty index. Default: journal on a device pool (/dev/daxX.Y) and with --standby (its only "
        "choice), start-empty on a file pool.",
    ),
    standby: bool = typer.Option(
        False,
        "--standby",
        help="Take part in the leader election through etcd: wait as a standby (nothing answered or "
        "written, /readyz 503, a copy of the index kept in step with the pool's journal) and take over "
        "when the leader's lease lapses (the copy finished from the journal, epoch bump, same rings). "
        "Every server of the pool runs with it.",
    ),
    cold_standby: bool = typer.Option(
        False,
        "--cold-standby",
        help="With --standby: keep no copy of the index while standing by (no memory for it, the pool "
        "not mapped); a takeover then rebuilds the whole index from the journal (slower: seconds per "
        "100 k blocks).",
    ),
    etcd: str | None = typer.Option(
        None,
        "--etcd",
        metavar="URL[,URL]",
        help="etcd client URLs for --standby (default: serve.metadata.etcd.endpoints).",
    ),
    member: str | None = typer.Option(
        None,
        "--member",
        metavar="NAME",
        help="This server's name in the election (default: --host, else this machine's hostname).",
    ),
    leader_ttl: int | None = typer.Option(
        None,
        "--leader-ttl",
        metavar="SECONDS",
        help="The leader's etcd lease TTL, whole seconds, 2..60 (default: serve.metadata.etcd.leader_ttl_s, 5).",
    ),
    spin_after_ms: int | None = typer.Option(
        None,
        "--spin-after-ms",
        metavar="MS",
        help="Busy-poll the CXL-RPC rings this long after a request, then poll every 0.1 ms for 50 ms "
        "and every 0.25 ms after that (default: serve.metadata.spin_after_ms, 50; 0: never busy-poll, "
        "only the 0.25 ms poll).",
    ),  # fmt: skip
    json_out: bool = typer.Option(False, "--json", help="Print the start-up record as JSON on stdout."),
) -> None:
    """Serve the KV index over CXL-RPC (pool slot rings) and TCP, with /healthz /readyz /metrics /stats.

    Every start bumps the pool epoch, which fences clients, leases and reservations of the previous
    incarnation. Restart policy journal (the default on a device pool): commits and removals are
    journaled in the pool's metadata area and the index is rebuilt from it at start (committed blocks
    only; nothing half-written is ever restored). start-empty (the default on a file pool): the index
    starts empty and clients repopulate it.
    Stop with SIGTERM (graceful, exit 0) or Ctrl-C (graceful, exit 130).
    """
    import json
    import math
    import signal

    from belugactl.cli.bind_address import checked_bind
    from belugactl.cli.load_rack import rack_context
    from belugactl.dataplane.mds.index import IndexConfig
    from belugactl.dataplane.mds.server import ServerConfig, open_server
    from belugactl.errors import UsageError

    # Before the manifest or the pool: a bad address is a usage error, not a port in use.
    bind, rpc_bind = checked_bind(bind), checked_bind(rpc_bind, "--rpc-bind")
    rack = rack_context(file, host=host, pool=pool)
    manifest = rack.manifest
    ms = manifest.serve.metadata if manifest.serve is not None else None
    if not 0 < low_watermark < high_watermark <= 1:
        raise UsageError(
            "watermarks must satisfy 0 < low < high <= 1", fix="e.g. --high-watermark 0.9 --low-watermark 0.8"
        )
    for flag, seconds in (("--lease-ttl", lease_ttl), ("--reservation-ttl", reservation_ttl)):
        if not math.isfinite(seconds) or seconds <= 0:
            # a zero or negative TTL expires every lease and reservation the moment it is granted
            raise UsageError(f"{flag} {seconds:g}: a TTL is a positive number of seconds", fix=f"e.g. {flag} 10")
    if restart_policy is None:
        restart_policy = default_restart_policy(standby, rack.pool_path)
    if restart_policy not in ("start-empty", "journal"):
        raise UsageError(f"unknown restart policy {restart_policy!r}", fix="use start-empty or journal")
    if standby and restart_policy != "journal":
        raise UsageError(
            "--standby takes over with the index the journal keeps: --restart-policy start-empty would empty it",
            fix="drop --restart-policy (journal is the default with --standby)",
        )
    elector = _elector(manifest, ms, host, etcd, member, leader_ttl) if standby else None
    if cold_standby and not standby:
        raise UsageError("--cold-standby is for --standby", fix="add --standby, or drop --cold-standby")
    if not standby and (etcd or member or leader_ttl is not None):
        raise UsageError("--etcd, --member and --leader-ttl are for --standby", fix="add --standby, or drop them")
    default_bind = ms.admin_bind if ms is not None else "127.0.0.1"
    for name, port in (("--admin-port", admin_port), ("--rpc-port", rpc_port)):
        if port is not None and not 0 <= port <= 65535:
            raise UsageError(f"{name} {port} is not a TCP port", fix=f"pass {name} in 1..65535 (0: any free port)")
    limits = _tcp_limits(ms, tcp_max_connections, tcp_idle_timeout, tcp_max_buffered, tcp_accept_backoff_ms)
    for name, value in (("--lease-ttl", lease_ttl), ("--reservation-ttl", reservation_ttl)):
        if not 0 < value <= 86400:
            raise UsageError(f"{name} {value:g} is outside (0, 86400] seconds", fix=f"pass e.g. {name} 30")
    if not 0 <= fence_grace <= 3600:
        raise UsageError(f"--fence-grace {fence_grace:g} is outside [0, 3600] seconds", fix="pass e.g. --fence-grace 0")
    spin_after = spin_after_ms if spin_after_ms is not None else (ms.spin_after_ms if ms is not None else 50)
    if not 0 <= spin_after <= 60_000:
        raise UsageError(f"--spin-after-ms {spin_after} is outside [0, 60000]", fix="pass e.g. --spin-after-ms 50")
    config = ServerConfig(
        idle_after_s=spin_after / 1000,
        rpc_bind=rpc_bind or bind or getattr(ms, "rpc_bind", None) or default_bind,
        rpc_port=None if no_tcp else (rpc_port if rpc_port is not None else (ms.rpc_port if ms else 9471)),
        admin_bind=bind or default_bind,
        admin_port=admin_port if admin_port is not None else (ms.admin_port if ms else 9470),
        fence_grace_s=fence_grace,
        restart_policy=restart_policy,
        tcp=limits,
        index=IndexConfig(
            lease_ttl_s=lease_ttl,
            reservation_ttl_s=reservation_ttl,
            high_watermark=high_watermark,
            low_watermark=low_watermark,
            zero_on_free=zero_on_free,
            max_namespaces=ms.max_namespaces if ms is not None else 4096,
            client_live_leases=ms.client_live_leases if ms is not None else 32768,
            **_interleave(manifest),
        ),
    )
    if elector is not None:
        _run_elected(
            elector, lambda: open_server(rack.pool_path(), manifest, config), config, json_out, warm=not cold_standby
        )
        return
    server = open_server(rack.pool_path(), manifest, config)
    try:
        server.start()
    except BaseException:
        server.close()
        server.pool.close()
        raise

    interrupted: list[int] = []

    def _term(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
        server.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    record = {
        "event": "started",
        "pool": str(server.pool.path),
        "epoch": server.epoch,
        "rpc": f"tcp://{config.rpc_bind}:{server.tcp_port}" if server.tcp_port else None,
        "cxl": f"cxl://{server.pool.path}#<ring>",
        "admin": f"http://{config.admin_bind}:{server.admin_port}" if server.admin_port else None,
        "restart_policy": restart_policy,
        "restored_entries": server.restored_entries,
        "native_helper": server.snapshot["pool"]["native_helper"],
        "fence_grace_s": fence_grace,
        "reserve_quarantine_s": round(server.fencing.quarantine_s, 3),
        "tcp_limits": vars(limits),
    }
    if json_out:
        print(json.dumps(record), flush=True)
    else:
        print(
            f"metadata server: epoch {server.epoch}, pool {server.pool.path}, rpc {record['rpc']}, "
            f"admin {record['admin']} (ready after {fence_grace:g} s)",
            file=sys.stderr,
            flush=True,
        )
    try:
        server.serve_forever()
    finally:
        server.close()
        server.pool.close()
    if interrupted:
        from belugactl.cli.interrupt import exit_interrupted

        kept = "the journal keeps the committed entries" if restart_policy == "journal" else "the index is gone"
        exit_interrupted(
            f"stopped cleanly: sockets closed, pool {server.pool.path} left as it is (epoch {server.epoch}), {kept}",
        )
    print("metadata server: stopped", file=sys.stderr)


def default_restart_policy(standby: bool, pool_path: Callable[[], str]) -> str:
    """journal with --standby and on a device pool (its index is a rack's whole cache, hours of GPU
    time); start-empty on a file pool (a test or a demo on one machine)."""
    return "journal" if standby or _is_device(pool_path) else "start-empty"


def _is_device(pool_path: Callable[[], str]) -> bool:
    """Whether the pool is a character device (devdax). Finding it may fail (no device, two of them):
    that error is raised here, once (the path is kept for the open). A path that cannot be read is not
    a device: the open reports it."""
    import stat

    path = Path(pool_path())
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _elector(
    manifest: object, ms: object | None, host: str | None, etcd: str | None, member: str | None, ttl: int | None
) -> object:
    """The election (dataplane/mds/leadership.py) from the flags, else serve.metadata.etcd."""
    import socket

    from belugactl.dataplane.mds.leadership import Elector, Etcd3gwKV, leader_key, parse_endpoints
    from belugactl.errors import UsageError

    conf = getattr(ms, "etcd", None)
    if etcd is None and conf is None:
        raise UsageError(
            "--standby needs etcd: no --etcd and no serve.metadata.etcd in the manifest",
            fix="pass --etcd http://HOST:2379[,URL...] or set serve.metadata.etcd.endpoints",
        )
    try:
        endpoints = parse_endpoints(etcd if etcd is not None else conf.endpoints)  # type: ignore[union-attr]
    except ValueError as exc:
        raise UsageError(f"--etcd: {exc}", fix="pass --etcd http://HOST:2379[,http://HOST2:2379]") from None
    seconds = ttl if ttl is not None else (conf.leader_ttl_s if conf is not None else 5)  # type: ignore[union-attr]
    if not 2 <= seconds <= 60:
        raise UsageError(f"--leader-ttl {seconds} is outside 2..60 seconds", fix="pass e.g. --leader-ttl 5")
    name = member or host or socket.gethostname()
    if not 0 < len(name) <= 128 or not name.isprintable():
        raise UsageError(f"--member {name!r}: 1 to 128 printable characters", fix="pass e.g. --member mds-a")
    kv = Etcd3gwKV(endpoints, timeout_s=min(1.0, seconds / 4))
    return Elector(kv, name, leader_key(manifest.name), ttl_s=float(seconds))  # type: ignore[attr-defined]


def _run_elected(elector: object, make_server: object, config: object, json_out: bool, *, warm: bool = True) -> None:
    """Standby, leader, standby again...: one start record per change of role (JSON lines with --json)."""
    import json
    import signal

    from belugactl.dataplane.mds.standby import ElectedRun

    def event(name: str, info: dict) -> None:
        record: dict = {"event": name, "member": elector.member}  # type: ignore[attr-defined]
        server = info.pop("server", None)
        if server is not None:
            record.update(
                {
                    "pool": str(server.pool.path),
                    "epoch": server.epoch,
                    "rpc": f"tcp://{config.rpc_bind}:{server.tcp_port}" if server.tcp_port else None,  # type: ignore[attr-defined]
                    "cxl": f"cxl://{server.pool.path}#<ring>",
                    "admin": f"http://{config.admin_bind}:{server.admin_port}" if server.admin_port else None,  # type: ignore[attr-defined]
                    "restart_policy": config.restart_policy,  # type: ignore[attr-defined]
                    "restored_entries": server.restored_entries,
                    "reserve_quarantine_s": round(server.fencing.quarantine_s, 3),
                }
            )
        record.update(info)
        if json_out:
            print(json.dumps(record, default=str), flush=True)
        else:
            print(
                f"metadata server ({record['member']}): {name} {json.dumps(info, default=str)}",
                file=sys.stderr,
                flush=True,
            )

    run = ElectedRun(
        elector,  # type: ignore[arg-type]
        make_server,  # type: ignore[arg-type]
        event,
        admin_bind=config.admin_bind,  # type: ignore[attr-defined]
        admin_port=config.admin_port,  # type: ignore[attr-defined]
        warm=warm,
    )
    interrupted: list[int] = []

    def _term(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
        run.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    run.run()
    if interrupted:
        from belugactl.cli.interrupt import exit_interrupted

        exit_interrupted("stopped cleanly: the lease revoked (a standby takes over), the journal keeps the index")
    print("metadata server: stopped", file=sys.stderr)


def _interleave(manifest: object) -> dict[str, int]:
    """The manifest's software interleave as IndexConfig fields (none for hardware interleave)."""
    from belugactl.model.layout import software_stripes

    stripes = software_stripes(manifest)  # type: ignore[arg-type]
    if stripes is None:
        return {}
    chunk = 2 << 20  # the allocator places whole 2 MiB chunks: round a finer granularity up
    return {"interleave_ways": stripes.ways, "interleave_granularity": -(-stripes.granularity // chunk) * chunk}


def _tcp_limits(
    ms: object | None,
    max_connections: int | None,
    idle_timeout: float | None,
    max_buffered: str | None,
    accept_backoff_ms: int | None,
) -> object:
    """The TCP listener's limits: flags over the manifest's serve.metadata, range-checked the same way."""
    from belugactl.dataplane.mds.listener_tcp import TcpLimits
    from belugactl.errors import UsageError
    from belugactl.model.manifest_schema import TCP_LIMIT_RANGES
    from belugactl.units import SizeParseError, parse_size

    def pick(flag: str, field: str, value: float | None, default: float) -> float:
        chosen = value if value is not None else getattr(ms, field, default)
        lo, hi = TCP_LIMIT_RANGES[field]
        if not lo <= chosen <= hi:
            raise UsageError(f"{flag} {chosen:g} is outside {lo}..{hi}", fix=f"pass a value in {lo}..{hi}")
        return chosen

    buffered: int | None = None
    if max_buffered is not None:
        try:
            buffered = parse_size(max_buffered)
        except SizeParseError as exc:
            raise UsageError(f"--tcp-max-buffered {max_buffered!r}: {exc}", fix="write e.g. 256KiB") from None
    defaults = TcpLimits()
    return TcpLimits(
        max_connections=int(pick("--tcp-max-connections", "tcp_max_connections", max_connections, 256)),
        idle_timeout_s=pick("--tcp-idle-timeout", "tcp_idle_timeout_s", idle_timeout, defaults.idle_timeout_s),
        max_buffered=int(pick("--tcp-max-buffered", "tcp_max_buffered", buffered, defaults.max_buffered)),
        accept_backoff_s=pick(
            "--tcp-accept-backoff-ms", "tcp_accept_backoff_ms", accept_backoff_ms, defaults.accept_backoff_s * 1000
        )
        / 1000,
    )
