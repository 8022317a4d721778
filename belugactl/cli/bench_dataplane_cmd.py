"""`belugactl bench rpc`, `bench mds` and `bench checksum`: the data plane's benchmarks, side by side with baselines."""

from __future__ import annotations

import typer


def register(bench: typer.Typer) -> None:
    bench.command("rpc")(rpc)
    bench.command("mds")(mds)
    bench.command("checksum")(checksum)


def checksum(
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
    quick: bool = typer.Option(False, "--quick", help="One 64 KiB buffer and 8 MiB of traffic (a smoke run)."),
) -> None:
    """CRC32C block checksums (what readers verify, docs/dataplane.md "Checksums") beside a plain copy:
    checksum alone, plain copy, copy and checksum in one pass, and a copy followed by a checksum pass."""
    from belugactl.cli.render import print_json, stdout_console
    from belugactl.workflows.bench.checksum import measure

    result = measure((64 << 10,), 8 << 20) if quick else measure()
    if json_out:
        print_json(result)
        return
    console = stdout_console()
    console.print(f"[bold]bench checksum[/]: kernel {result['kernel']} (GB/s, best of 3 rounds)")
    for row in result["sizes"]:
        console.print(
            f"{row['bytes'] >> 10:>8} KiB: crc32c {row['crc32c_gbps']:6.2f}  copy {row['copy_gbps']:6.2f}  "
            f"copy+crc32c in one pass {row['copy_crc32c_gbps']:6.2f} ({row['fused_over_copy']:.2f}x of copy)  "
            f"copy then crc32c {row['copy_then_crc32c_gbps']:6.2f}"
        )


def rpc(
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
    samples: int = typer.Option(20000, "--samples", metavar="N", help="Round trips measured at QD1, per transport."),
    seconds: float = typer.Option(0.5, "--seconds", metavar="SECONDS", help="Seconds per queue-depth throughput run."),
    pin: bool = typer.Option(True, "--pin/--no-pin", help="Pin client and server to different CPUs."),
    flush: bool = typer.Option(False, "--flush", help="Flush lines as on a shared write-back devdax pool."),
    lookup_keys: int = typer.Option(
        0,
        "--lookup-keys",
        metavar="N",
        help="Also time a pool hit's metadata over CXL-RPC: one GET_MANY burst for N keys (125: a 4000-token "
        "prompt of 32-token blocks) and its lease release, waited for and no-wait (0: skip; 125 with --idle-ms).",
    ),
    idle_ms: str = typer.Option(
        "",
        "--idle-ms",
        metavar="MS,...",
        help="Idle pauses before each of those lookups, comma separated (e.g. 0,1,100); each is printed beside "
        "the first one, the baseline. Default 0.",
    ),
    lookup_rounds: int = typer.Option(
        20, "--lookup-rounds", metavar="N", help="Rounds of those lookups per idle pause."
    ),
) -> None:
    """One metadata server, the same 64 B lookup over CXL-RPC (file-backed pool) and TCP loopback;
    with --lookup-keys or --idle-ms, a pool hit's GET_MANY burst and lease release after idle pauses."""
    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.workflows.bench.rpc_mds import QDS, bench_rpc

    pauses = _idle_pauses(idle_ms)
    if idle_ms and not lookup_keys:
        lookup_keys = 125
    if not 0 <= lookup_keys <= 4096:
        raise UsageError(f"--lookup-keys {lookup_keys} is out of range", fix="pass 1 to 4096 keys (0: skip)")
    if not 1 <= lookup_rounds <= 10_000:
        raise UsageError(f"--lookup-rounds {lookup_rounds} is out of range", fix="pass 1 to 10000 rounds")
    result = bench_rpc(
        samples=samples,
        seconds=seconds,
        pin=pin,
        flush=flush,
        lookup_keys=lookup_keys,
        idle_ms=pauses,
        lookup_rounds=lookup_rounds,
    )
    if json_out:
        print_json(result)
        return
    from rich.table import Table

    from belugactl.cli.render import stdout_console

    console = stdout_console()
    console.print(
        f"[bold]bench rpc[/]: {result['request']}; pool {result['pool']}; "
        f"native helper {'yes' if result['native_helper'] else 'NO'}; pinned {result['pinned_cpus']}; "
        f"{result['cpus']} CPUs, load average {result['load_average_1m']}"
    )
    table = Table("", "CXL-RPC", "TCP loopback", "TCP / CXL")
    cxl, tcp = result["cxl"], result["tcp"]
    table.add_row(
        "QD1 p50 (us)",
        f"{cxl['qd1']['p50_us']:.2f}",
        f"{tcp['qd1']['p50_us']:.2f}",
        f"{result['ratios']['tcp_over_cxl_p50']:.1f}x",
    )
    table.add_row(
        "QD1 p99 (us)",
        f"{cxl['qd1']['p99_us']:.2f}",
        f"{tcp['qd1']['p99_us']:.2f}",
        f"{result['ratios']['tcp_over_cxl_p99']:.1f}x",
    )
    for qd in QDS:
        c, t = cxl["ops_per_s"][str(qd)], tcp["ops_per_s"][str(qd)]
        table.add_row(f"QD{qd} (kops/s)", f"{c / 1e3:.1f}", f"{t / 1e3:.1f}", f"{c / t:.1f}x (CXL/TCP)")
    native_thr = cxl.get("ops_per_s_native_client")
    if native_thr:
        for qd in QDS:
            c, t = native_thr[str(qd)], tcp["ops_per_s"][str(qd)]
            table.add_row(f"QD{qd} C client (kops/s)", f"{c / 1e3:.1f}", "-", f"{c / t:.1f}x (vs TCP row)")
    console.print(table)
    targets = Table("target", "goal", "measured", "met")
    for name, t in result["targets"].items():
        targets.add_row(name, str(t["target"]), str(t["measured"]), "yes" if t["met"] else "no")
    console.print(targets)
    cal = result["calibration"]
    console.print(
        f"calibration: bare shm ping-pong in Python {cal['shm_pingpong_python_p50_us']} us, "
        f"TCP echo in Python {cal['tcp_loopback_echo_python_p50_us']} us; paper CXL-RPC "
        f"{cal['paper_cxl_rpc_qd1_us']} us QD1, {cal['paper_cxl_rpc_qd128_mops']} Mops QD128"
    )
    if result["lookups"]:
        console.print(_lookups_table(result["lookups"]))


def _idle_pauses(text: str) -> list[float]:
    """`--idle-ms 0,1,100` as milliseconds; checked before any work."""
    from belugactl.errors import UsageError

    if not text.strip():
        return [0.0]
    try:
        pauses = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(
            f"--idle-ms {text}: expected numbers separated by commas", fix="e.g. --idle-ms 0,1,100"
        ) from None
    if not pauses or not all(0 <= ms <= 10_000 for ms in pauses):
        raise UsageError(f"--idle-ms {text}: each pause between 0 and 10000 ms", fix="e.g. --idle-ms 0,1,100")
    return pauses


def _lookups_table(doc: dict) -> object:
    """One row per operation, one column per idle pause, each beside the baseline pause's."""
    from rich.table import Table

    base = doc["baseline_idle_ms"]
    title = (
        f"pool hit's metadata over CXL-RPC: {doc['keys']} keys in {doc['get_many_messages']} GET_MANY messages, "
        f"median us of {doc['rounds']} rounds (x: over {base} ms idle)"
    )
    table = Table("", *[f"after {ms} ms idle" for ms in doc["idle_ms"]], title=title)
    labels = {"lookup": "lookup (GET_MANY burst)", "release": "release, waited", "release_nowait": "release, no-wait"}
    for op, label in labels.items():
        cells = []
        for ms in doc["idle_ms"]:
            us = doc["median_us"][op][ms]
            ratio = doc["over_baseline"][op].get(ms)
            cells.append("-" if us is None else f"{us:.1f}" + ("" if ratio is None else f" ({ratio:.2f}x)"))
        table.add_row(label, *cells)
    return table


def mds(
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
    ops: int = typer.Option(200_000, "--ops", metavar="N", help="Index operations to run."),
    ways: int = typer.Option(
        4, "--ways", metavar="N", help="Software interleave zones (memory devices) to report bytes over."
    ),
    batch_blocks: int = typer.Option(
        62, "--batch-blocks", metavar="N", help="Blocks per save in the batched-put comparison."
    ),
    batch_rounds: int = typer.Option(
        100, "--batch-rounds", metavar="N", help="Saves each way in that comparison (0: skip it)."
    ),
    pin: bool = typer.Option(True, "--pin/--no-pin", help="Pin client and server to different CPUs (comparison)."),
    idle: bool = typer.Option(
        False,
        "--idle",
        help="Also measure an idle server: its CPU while nobody asks and a PING after a quiet spell, waiting idle "
        "(--spin-after-ms 0) beside busy-polling.",
    ),
    idle_rings: int = typer.Option(
        4, "--idle-rings", metavar="N", help="Rings the idle server polls (processes + spares)."
    ),
    idle_seconds: float = typer.Option(
        5.0, "--idle-seconds", metavar="SECONDS", help="Seconds each idle server's CPU is measured over."
    ),
    idle_pings: int = typer.Option(
        100, "--idle-pings", metavar="N", help="PINGs timed after a quiet spell, per server."
    ),
    scale: bool = typer.Option(
        False,
        "--scale",
        help="Instead: the server at the rack's size (issue 31): a sparse pool of the 16-host example's size "
        "filled to each of --sizes, and a server at each of --rings; every figure beside its target.",
    ),
    sizes: str = typer.Option("100k,1M,4M", "--sizes", metavar="N,...", help="With --scale: index sizes, blocks."),
    rings: str = typer.Option("16,128,512,1152", "--rings", metavar="N,...", help="With --scale: ring counts."),
    block_size: str = typer.Option("2MiB", "--block-size", metavar="SIZE", help="With --scale: a block's size."),
    scale_pool: str = typer.Option(
        "", "--pool", metavar="PATH", help="With --scale: create the sparse pool file here (default: a temp file)."
    ),
    budget_s: float = typer.Option(
        1800.0,
        "--budget-s",
        metavar="SECONDS",
        help="With --scale: the whole run's bound; what does not fit is skipped.",
    ),
    save_blocks: int = typer.Option(
        64,
        "--save-blocks",
        metavar="N",
        help="With --scale: blocks a save of the fill (64: a 2000-token prompt; a long prompt's is thousands).",
    ),
    save_over: str = typer.Option(
        "cxl",
        "--save-over",
        metavar="cxl|tcp",
        help="With --scale: the fill's saves over a CXL ring, or over TCP (whose frames carry a whole batch).",
    ),
) -> None:
    """Index operations per second (put/commit/lookup mix), allocator utilization under churn,
    bytes per zone with software interleave (pool.interleave.mode: software) against none, and a
    request's save as single reserves+commits against one batched burst (a real server, CXL-RPC and TCP);
    with --idle, what an idle server costs and how fast it answers."""
    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.workflows.bench.rpc_mds import bench_mds

    if scale:
        _mds_scale(sizes, rings, block_size, scale_pool, budget_s, json_out, save_blocks, save_over)
        return
    if not 3 <= idle_rings <= 1024:
        raise UsageError(f"--idle-rings {idle_rings} is out of range", fix="pass 3 to 1024 rings")
    if not 1 <= idle_pings <= 100_000:
        raise UsageError(f"--idle-pings {idle_pings} is out of range", fix="pass 1 to 100000 pings")
    if not 0.1 <= idle_seconds <= 600:
        raise UsageError(f"--idle-seconds {idle_seconds} is out of range", fix="pass 0.1 to 600 seconds")

    if not 1 <= ways <= 64:
        raise UsageError(f"--ways {ways} is out of range", fix="pass a number of zones between 1 and 64")
    if not 1 <= batch_blocks <= 1024:
        raise UsageError(f"--batch-blocks {batch_blocks} is out of range", fix="pass 1 to 1024 blocks per save")
    if not 0 <= batch_rounds <= 100_000:
        raise UsageError(f"--batch-rounds {batch_rounds} is out of range", fix="pass 0 (skip) to 100000 rounds")
    result = bench_mds(ops=ops, ways=ways, batch_blocks=batch_blocks, batch_rounds=batch_rounds, pin=pin)
    if idle:
        from belugactl.workflows.bench.mds_idle import bench_idle_server

        result["idle_server"] = bench_idle_server(rings=idle_rings, seconds=idle_seconds, pings=idle_pings)
    if json_out:
        print_json(result)
        return
    from belugactl.cli.render import stdout_console

    console = stdout_console()
    i, a = result["index"], result["allocator_churn"]
    console.print(
        f"[bold]bench mds[/]: {i['ops']} index ops in {i['seconds']} s = {i['ops_per_s']:,} ops/s "
        f"(mix {i['mix']}); {i['entries']} entries, {i['evictions']} evictions"
    )
    console.print(
        f"allocator churn: live bytes / area peak {a['live_bytes_over_area_peak']:.1%}, "
        f"end {a['live_bytes_over_area_end']:.1%}; fill of handed-out blocks {a['fill_of_handed_out_blocks']:.1%}; "
        f"{a['alloc_failures']} failed allocations; {a['classes_in_use']} size classes in use"
    )
    il = result["interleave"]
    held = ", ".join(f"{b / 2**20:.0f}" for b in i["zone_bytes"])
    policy = f"software interleave ({il['ways']} zones)" if il["ways"] > 1 else "no interleave"
    console.print(f"index on {policy}: MiB held per zone [{held}]")
    for name in ("software", "none"):
        z = il[name]
        placed = ", ".join(f"{b / 2**20:.0f}" for b in z["placed_zone_bytes"])
        zones = ", ".join(f"{b / 2**20:.0f}" for b in z["zone_bytes"])
        console.print(
            f"interleave {name:8} ({il['ways']} zones): MiB placed per zone [{placed}] "
            f"(min/max {z['placed_min_over_max']:.2f}), live at the end [{zones}] (min/max {z['min_over_max']:.2f}); "
            f"16 consecutive blocks span {z['zones_spanned_by_16_consecutive_blocks']} zones"
        )
    b = result["batched_puts"]
    if b:
        for name in ("cxl", "tcp"):
            one, many = b[name]["single"], b[name]["batched"]
            console.print(
                f"save of {b['blocks_per_save']} blocks over {name.upper()}: single reserve+commit "
                f"{one['block_puts_per_s']:,} puts/s ({one['messages_per_save']:.0f} messages, "
                f"{one['round_trips_per_save']:.0f} round trips a save) vs batched "
                f"{many['block_puts_per_s']:,} puts/s ({many['messages_per_save']:.0f} messages, "
                f"{many['round_trips_per_save']:.0f} round trips): {b[name]['batched_over_single']:.1f}x; "
                f"server time a save {one['server_us_per_save']:,.0f} vs {many['server_us_per_save']:,.0f} us"
            )
    if result.get("idle_server"):
        _print_idle_server(console, result["idle_server"])


def _print_idle_server(console: object, doc: dict) -> None:
    """The idle-waiting server beside the busy-polling one (the baseline)."""
    from rich.table import Table

    table = Table(
        "",
        "waiting idle (--spin-after-ms 0)",
        "busy-polling (baseline)",
        "idle / busy",
        title=f"idle metadata server, {doc['rings']} rings: CPU over {doc['seconds']} s, "
        f"PING after {doc['quiet_ms']:g} ms of quiet ({doc['pings']} pings)",
    )
    w, b, r = doc["idle_wait"], doc["busy_poll"], doc["idle_wait_over_busy_poll"]
    cpu = ("CPU while idle (share of a core)", f"{w['cpu_share']:.1%}", f"{b['cpu_share']:.1%}", _x(r["cpu_share"]))
    table.add_row(*cpu)
    table.add_row("PING p50 (us)", f"{w['ping_us']['p50']:.0f}", f"{b['ping_us']['p50']:.0f}", _x(r["ping_p50_us"]))
    table.add_row(
        "PING p10 to p90 (us)",
        f"{w['ping_us']['p10']:.0f} to {w['ping_us']['p90']:.0f}",
        f"{b['ping_us']['p10']:.0f} to {b['ping_us']['p90']:.0f}",
        "",
    )
    console.print(table)  # type: ignore[attr-defined]


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _mds_scale(
    sizes: str,
    rings: str,
    block_size: str,
    pool: str,
    budget_s: float,
    json_out: bool,
    save_blocks: int,
    save_over: str,
) -> None:
    """`bench mds --scale`: arguments checked before any work, then one table of figures and targets."""
    from pathlib import Path

    from belugactl.cli.render import print_json, stdout_console
    from belugactl.errors import UsageError
    from belugactl.units import parse_size
    from belugactl.workflows.bench.mds_scale import bench_scale
    from belugactl.workflows.bench.mds_scale_report import parse_counts

    try:
        size_list = parse_counts(sizes, lowest=1_000, highest=64_000_000)
    except ValueError:
        raise UsageError(f"--sizes {sizes}: expected block counts 1k to 64M", fix="e.g. --sizes 100k,1M,4M") from None
    try:
        ring_list = parse_counts(rings, lowest=3, highest=4096)
    except ValueError:
        raise UsageError(
            f"--rings {rings}: expected ring counts 3 to 4096", fix="e.g. --rings 16,128,512,1152"
        ) from None
    try:
        block = parse_size(block_size)
    except ValueError:
        block = 0
    if not 4096 <= block <= 64 << 20 or block % 4096:
        raise UsageError(f"--block-size {block_size}: a multiple of 4 KiB up to 64 MiB", fix="e.g. --block-size 2MiB")
    if not 10 <= budget_s <= 86_400:
        raise UsageError(f"--budget-s {budget_s:g} is out of range", fix="pass 10 to 86400 seconds")
    if not 1 <= save_blocks <= 65_535:
        raise UsageError(f"--save-blocks {save_blocks} is out of range", fix="pass 1 to 65535 blocks a save")
    if save_over not in ("cxl", "tcp"):
        raise UsageError(f"--save-over {save_over}: expected cxl or tcp", fix="pass --save-over cxl or --save-over tcp")
    pool_path = Path(pool) if pool else None
    if pool_path is not None and (pool_path.exists() or pool_path.is_symlink() or not pool_path.parent.is_dir()):
        raise UsageError(
            f"--pool {pool}: the benchmark creates this file (and removes it after)",
            fix="name a file that does not exist yet, in an existing directory",
        )
    result = bench_scale(
        sizes=size_list,
        rings=ring_list,
        block=block,
        pool=pool_path,
        budget_s=budget_s,
        save_blocks=save_blocks,
        save_over=save_over,
    )
    if json_out:
        print_json(result)
        return
    from rich.table import Table

    console = stdout_console()
    p = result["pool"]
    console.print(
        f"[bold]bench mds --scale[/]: {result['started_utc']}, {result['seconds']} s; pool {p['bytes'] >> 40} TiB "
        f"sparse file, {p['rings']} rings, {block_size} blocks saved {result['blocks_per_save']} a save; "
        f"{result['cpus']} CPUs, load average {result['load_average_1m_at_start']} -> "
        f"{result['load_average_1m_at_end']}"
    )
    table = Table("what", "at", "measured", "target", "met")
    for what, at, measured, target, met in result["table"]:
        table.add_row(what, at, measured, target, "-" if met is None else ("yes" if met else "NO"))
    console.print(table)
    t = result["targets"]
    console.print(f"targets: {t['met']} met, {t['not_met']} not met, {t['not_judged']} not judged here")
    for note in result["notes"]:
        console.print(f"note: {note}")
