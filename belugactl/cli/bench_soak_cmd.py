"""`belugactl bench soak`: writers and readers over CXL-RPC and TCP against a real metadata server
that is SIGKILLed and restarted, with client kills and eviction pressure, checked byte for byte."""

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
    keys: int = typer.Option(300, "--keys", metavar="N", help="Distinct keys; with --kv-mib, how hard eviction works."),
    kv_mib: int = typer.Option(64, "--kv-mib", metavar="MIB", help="Shared KV area of the soak's pool, MiB."),
    restart_every: float = typer.Option(
        8.0, "--restart-every", metavar="SECONDS", help="SIGKILL and restart the server every N s (0: never)."
    ),
    kill_every: float = typer.Option(
        3.0, "--kill-every", metavar="SECONDS", help="SIGKILL one client every N s and start another (0: never)."
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
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
) -> None:
    """Run the soak; exit 1 if any reader was served a wrong byte."""
    from belugactl.cli.render import print_json
    from belugactl.workflows.bench.soak import SoakConfig, run_soak

    cfg = SoakConfig(
        seconds=seconds, ops=ops, writers=writers, readers=readers, keys=keys, kv_mib=kv_mib,
        restart_every_s=restart_every, kill_every_s=kill_every, restart_policy=restart_policy,
        fence_grace_s=fence_grace, seed=seed, faulty_writer=faulty_writer,
        stall_writers=stall_writers, reservation_ttl_s=reservation_ttl,
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
        verdict = "[green]0[/]" if not r["wrong_reads"] else f"[red]{r['wrong_bytes']:,} in {r['wrong_reads']} reads[/]"
        console.print(f"wrong bytes served: {verdict}; corrupt blocks detected (misses): {r['corrupt_detected']}")
        for line in r["wrong_examples"]:
            console.print(f"  {line}")
    if result["wrong_reads"]:
        raise typer.Exit(1)
