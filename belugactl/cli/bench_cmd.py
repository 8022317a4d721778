"""`belugactl bench ...`: benchmarks that print ratios against a baseline run side by side."""

from __future__ import annotations

import importlib

import typer

# Each module exposes `register(bench: typer.Typer) -> None` and adds its subcommands.
BENCH_MODULES: tuple[str, ...] = (
    "belugactl.cli.bench_dataplane_cmd",  # rpc, mds
    "belugactl.cli.bench_serving_cmd",  # kv, serve
    "belugactl.cli.bench_soak_cmd",  # soak
    "belugactl.cli.bench_overlap_cmd",  # overlap
    "belugactl.cli.bench_pool_cmd",  # pool
    "belugactl.cli.bench_failover_cmd",  # failover
)


def register(app: typer.Typer) -> None:
    bench = typer.Typer(
        help="Data-plane benchmarks, each side by side with its baseline (ratios, not timed tests).",
        no_args_is_help=True,
    )
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench)
    app.add_typer(bench, name="bench")
