"""`belugactl bench soak`: writers and readers over CXL-RPC and TCP against a real metadata server
that is SIGKILLed and restarted, with client kills and eviction pressure, checked byte for byte.
`--elected`: a leader and a standby through etcd, the leader SIGKILLed instead of restarted.
`--mixed`: honest, stalling, forgetful and hostile tenants on one server (workflows/bench/soak_mixed.py)."""

from __future__ import annotations

import typer


def register(bench: typer.Typer) -> None:
    bench.command("soak")(soak)


def soak(
    seconds: float = typer.Option(30.0, "--seconds", metavar="SECONDS", help="How long to run."),
    ops: int = typer.Option(
        0, "--ops", metavar="N", help="Stop after this many client operations (0: only --seconds)."
    ),
    writers: int = typer.Option(
        4, "--writers", metavar="N", help="Writer processes (even ones on CXL-RPC rings, odd on TCP)."
    ),
    readers: int = typer.Option(4, "--readers", metavar="N", help="Reader processes (same split)."),
    keys: int | None = typer.Option(
        None,
        "--keys",
        metavar="N",
        help="Distinct keys; with --kv-mib, how hard eviction works (default 300; --mixed: 1.5x what the area holds).",
    ),
    kv_mib: int | None = typer.Option(
        None, "--kv-mib", metavar="MIB", help="Shared KV area of the soak's pool, MiB (default 64; --mixed: 1024)."
    ),
    restart_every: float | None = typer.Option(
        None,
        "--restart-every",
        metavar="SECONDS",
        help="SIGKILL and restart the server every N s (0: never; default 8, --mixed: 0).",
    ),
    kill_every: float | None = typer.Option(
        None,
        "--kill-every",
        metavar="SECONDS",
        help="SIGKILL one client every N s and start another (0: never; default 3, --mixed: 0).",
    ),
    restart_policy: str = typer.Option(
        "journal", "--restart-policy", metavar="start-empty|journal", help="The server's: journal or start-empty."
    ),
    reservation_ttl: float = typer.Option(
        3.0, "--reservation-ttl", metavar="SECONDS", help="The server's reservation TTL, seconds."
    ),
    fence_grace: float | None = typer.Option(
        None, "--fence-grace", metavar="SECONDS", help="Passed to the server (default: its own)."
    ),
    seed: int = typer.Option(1, "--seed", metavar="N", help="Random seed of the workload."),
    stall_writers: float = typer.Option(
        0.0,
        "--stall-writers",
        metavar="FRACTION",
        help="Fraction of writes that stall 0.5-8 s after their epoch check (stale writers).",
    ),
    faulty_writer: bool = typer.Option(
        False, "--faulty-writer", help="Check the checker: one writer writes wrong bytes (the run must exit 1)."
    ),
    elected: bool = typer.Option(
        False,
        "--elected",
        help="Two metadata servers elected through a throwaway etcd on loopback: each restart SIGKILLs the "
        "leader, the standby takes over, the killed one comes back as the standby (needs etcd-server).",
    ),
    leader_ttl: int = typer.Option(
        2, "--leader-ttl", metavar="SECONDS", help="--elected: the leader's etcd lease, seconds (2..60)."
    ),
    mixed: bool = typer.Option(
        False,
        "--mixed",
        help="Honest, stalling, forgetful (no checksum) and hostile tenants (lease, reservation, namespace and "
        "connection floods) on one server, quiet then attacked: goals beside figures; exit 1 if a goal fails.",
    ),
    stallers: int = typer.Option(1, "--stallers", metavar="N", help="--mixed: stalling writer processes."),
    forgetful: int = typer.Option(
        1, "--forgetful", metavar="N", help="--mixed: writers that commit without the CRC32C (must be refused)."
    ),
    attackers: str = typer.Option(
        "lease-flood,reserve-flood,namespace-churn,connection-flood",
        "--attackers",
        metavar="NAMES",
        help="--mixed: the hostile tenants, comma-separated (empty: none).",
    ),
    tenants: bool = typer.Option(
        True,
        "--tenants/--no-tenants",
        help="--mixed: the rack names tenants (honest, one per attacker, with quotas); --no-tenants: "
        "only the per-client caps.",
    ),
    p99_ratio_max: float | None = typer.Option(
        None,
        "--p99-ratio-max",
        metavar="RATIO",
        help="--mixed: fail when an honest p99 attacked is above RATIO times quiet (default: report only).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
) -> None:
    """Run the soak; exit 1 if any reader was served a wrong byte (--mixed: if any goal fails)."""
    from belugactl.cli.render import print_json
    from belugactl.workflows.bench.soak import SoakConfig, run_soak

    if mixed:
        _mixed(
            seconds, writers, readers, keys, kv_mib, restart_every, kill_every, restart_policy, reservation_ttl,
            seed, stallers, forgetful, attackers, tenants, p99_ratio_max, json_out,
        )  # fmt: skip
        return
    cfg = SoakConfig(
        seconds=seconds, ops=ops, writers=writers, readers=readers, keys=300 if keys is None else keys,
        kv_mib=64 if kv_mib is None else kv_mib, restart_every_s=8.0 if restart_every is None else restart_every,
        kill_every_s=3.0 if kill_every is None else kill_every, restart_policy=restart_policy,
        fence_grace_s=fence_grace, seed=seed, faulty_writer=faulty_writer,
        stall_writers=stall_writers, reservation_ttl_s=reservation_ttl, elected=elected, leader_ttl_s=leader_ttl,
    )  # fmt: skip
    result = run_soak(cfg)
    if json_out:
        print_json(result)
    else:
        from belugactl.cli.render import stdout_console

        r = result
        console = stdout_console()
        console.print(
            f"[bold]bench soak[/]: {r['ops']:,} ops in {r['seconds']} s ({r['writers']} writers, "
            f"{r['readers']} readers, CXL-RPC and TCP); {r['committed']:,} blocks committed, "
            f"{r['reads_verified']:,} reads verified, "
            f"{r['reads_void']} void (restart or lease during the copy), {r['misses']:,} misses"
        )
        console.print(
            f"server restarts {r['server_restarts']} (survived {r['restarts_survived']}), client kills "
            f"{r['client_kills']}, evictions {r['evictions']:,}; client errors {r['client_errors']}"
        )
        if "elected" in r:
            e = r["elected"]
            console.print(
                f"elected through etcd (lease {e['leader_ttl_s']} s): {e['leader_changes']} leader changes, "
                f"{e['warm_takeovers']} warm; SIGKILL to the standby serving p50 {e['takeover_p50_s']} s, "
                f"max {e['takeover_max_s']} s"
            )
        verdict = "[green]0[/]" if not r["wrong_reads"] else f"[red]{r['wrong_bytes']:,} in {r['wrong_reads']} reads[/]"
        console.print(f"wrong bytes served: {verdict}; corrupt blocks detected (misses): {r['corrupt_detected']}")
        for line in r["wrong_examples"]:
            console.print(f"  {line}")
    if result["wrong_reads"]:
        raise typer.Exit(1)


def _mixed(
    seconds: float, writers: int, readers: int, keys: int | None, kv_mib: int | None, restart_every: float | None,
    kill_every: float | None, restart_policy: str, reservation_ttl: float, seed: int, stallers: int, forgetful: int,
    attackers: str, tenants: bool, p99_ratio_max: float | None, json_out: bool,
) -> None:  # fmt: skip
    from belugactl.cli.render import print_json, stdout_console
    from belugactl.workflows.bench.soak_mixed import MixedConfig, run_mixed

    cfg = MixedConfig(
        seconds=seconds, writers=writers, readers=readers, stallers=stallers, forgetful=forgetful,
        attackers=tuple(a.strip() for a in attackers.split(",") if a.strip()), keys=keys or 0,
        kv_mib=1024 if kv_mib is None else kv_mib, restart_every_s=restart_every or 0.0,
        kill_every_s=kill_every or 0.0, restart_policy=restart_policy, reservation_ttl_s=reservation_ttl,
        p99_ratio_max=p99_ratio_max, seed=seed, tenants=tenants,
    )  # fmt: skip
    r = run_mixed(cfg)
    if json_out:
        print_json(r)
    else:
        from rich.table import Table

        console = stdout_console()
        t = r["tenants"]
        console.print(
            f"[bold]bench soak --mixed[/]: {r['seconds']} s ({r['warmup_s']} s warm-up, then {r['phase_s']} s "
            f"each quiet, attacked, quiet again); {t['writers']} writers, "
            f"{t['readers']} readers, {t['stallers']} stalling, {t['forgetful']} forgetful, hostile: "
            f"{', '.join(t['attackers']) or 'none'} ({'a tenant each' if r['tenants_in_rack'] else 'no tenants'}); "
            f"{r['ops']:,} honest ops, {r['committed']:,} committed, "
            f"{r['stalled_writes']} stalled writes, server restarts {r['server_restarts']}, client kills "
            f"{r['client_kills']}"
        )
        lat = Table(
            "honest", "per s before / after", "p50 quiet ms", "p99 quiet ms (before / after)", "per s attacked",
            "p50 attacked ms", "p99 attacked ms", "p99 ratio (worse of / quiet, / after)",
        )  # fmt: skip
        for row, e in r["latency"].items():
            lat.add_row(
                row, f"{e['per_s_quiet']} / {e['per_s_after']}", str(e["p50_quiet_ms"]),
                f"{e['p99_quiet_ms']} ({e['p99_before_ms']} / {e['p99_after_ms']})", str(e["per_s_attacked"]),
                str(e["p50_attacked_ms"]), str(e["p99_attacked_ms"]),
                "" if e["p99_ratio"] is None else f"{e['p99_ratio']:g}x",
            )  # fmt: skip
        console.print(lat)
        goals = Table("goal", "want", "figure", "met")
        for g in r["goals"]:
            met = "[green]yes[/]" if g["ok"] else ("[red]NO[/]" if g["ok"] is False else "reported")
            goals.add_row(g["goal"], g["want"], g["figure"], met)
        console.print(goals)
        for line in r["wrong_examples"]:
            console.print(f"  {line}")
    if r["failed"]:
        raise typer.Exit(1)
