"""`belugactl bench failover`: SIGKILL the elected metadata server's leader, time the first answer of
the standby that takes over, count committed blocks lost and wrong bytes served
(workflows/bench/failover.py); `start-empty` beside it. Exit 1 when a goal fails."""

from __future__ import annotations

import typer


def register(bench: typer.Typer) -> None:
    bench.command("failover")(failover)


def failover(
    kills: int = typer.Option(
        20, "--kills", metavar="N", help="Leaders SIGKILLed per size (each one times a failover)."
    ),
    blocks: str = typer.Option(
        "100k",
        "--blocks",
        metavar="N",
        help="Committed 4 KiB blocks in the index, one size or several: N[,N...] (k: 1000, M: 1000000; e.g. 100k,1M).",
    ),
    ttl: int = typer.Option(5, "--ttl", metavar="SECONDS", help="The leader's etcd lease TTL, whole seconds, 2..60."),
    etcd: str | None = typer.Option(
        None, "--etcd", metavar="URL", help="Use this running etcd (default: start a throwaway one on loopback)."
    ),
    start_empty: bool = typer.Option(
        True,
        "--with-start-empty/--no-start-empty",
        help="Beside the failover, one restart without the journal (--restart-policy start-empty): its first "
        "answer and hit rate.",
    ),
    cold_standby: bool = typer.Option(
        False,
        "--cold-standby",
        help="Standbys keep no copy of the index (metadata-server --cold-standby): each takeover rebuilds it "
        "from the journal. Default: warm standbys, each caught up with the journal before a kill.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
    faulty: bool = typer.Option(
        False, "--faulty", hidden=True, help="Check the checker: lose a block and change a block's bytes (exit 1)."
    ),
) -> None:
    """Failover by SIGKILL between two `metadata-server --standby` on one pool; exit 1 if a goal fails."""
    import signal
    import sys

    from belugactl.cli.render import print_json
    from belugactl.workflows.bench.failover import FailoverConfig, parse_sizes, run_failover

    cfg = FailoverConfig(
        kills=kills, sizes=parse_sizes(blocks), ttl_s=ttl, etcd_url=etcd, start_empty=start_empty, faulty=faulty,
        cold_standby=cold_standby,
    )  # fmt: skip
    # SIGTERM unwinds like Ctrl-C: the servers and the etcd this run started are stopped, never left behind.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        r = run_failover(cfg, say=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if json_out:
        print_json(r)
    else:
        _render(r)
    if r["failed"]:
        raise typer.Exit(1)


def _render(r: dict) -> None:
    from rich.table import Table

    from belugactl.cli.render import stdout_console

    console = stdout_console()
    console.print(
        f"[bold]bench failover[/]: {r['kills']} SIGKILLs of the leader per size, lease TTL {r['ttl_s']} s "
        f"(target {r['target_s']:g} s), etcd {r['etcd']}"
    )
    t = Table(
        "blocks", "first answer p50 / max s", "lost", "wrong bytes", "hit rate before / after",
        "start-empty: first answer s", "start-empty: hit rate",
    )  # fmt: skip
    for row in r["sizes"]:
        if "error" in row:
            t.add_row(f"{row['blocks']:,}", "not measured: see the goals below", *["-"] * 5)
            continue
        fa, se = row["first_answer_s"], row.get("start_empty")
        t.add_row(
            f"{row['blocks']:,}", f"{fa['p50']:g} / {fa['max']:g}", f"{row['committed_blocks_lost']:,}",
            f"{row['wrong_bytes_served']:,}", f"{row['hit_rate_before']:.4f} / {row['hit_rate_after']:.4f}",
            "-" if se is None else f"{se['first_answer_s']:g}", "-" if se is None else f"{se['hit_rate_after']:.4f}",
        )  # fmt: skip
    console.print(t)
    goals = Table("goal", "want", "figure", "met")
    for g in r["goals"]:
        goals.add_row(g["goal"], g["want"], g["figure"], "[green]yes[/]" if g["ok"] else "[red]NO[/]")
    console.print(goals)
