"""`belugactl bench pool`: the pool device's own speed beside local DRAM (workflows/bench/pool_speed.py)."""

from __future__ import annotations

from typing import Any

import typer

from belugactl.cli.options import file_option, host_option

MAX_THREADS = 256


def register(bench: typer.Typer) -> None:
    bench.command("pool")(pool)


def parse_threads(text: str) -> list[int]:
    """ "1,2,4" as given; a lone "N" as 1, 2, 4, ... up to N (N included). UsageError (exit 2) otherwise."""
    from belugactl.errors import UsageError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--threads {text}: expected a number N or numbers separated by commas (1,2,4)") from None
    if not values or any(v < 1 or v > MAX_THREADS for v in values):
        raise UsageError(f"--threads {text}: each thread count between 1 and {MAX_THREADS}")
    if len(values) == 1 and "," not in text:
        n, values = values[0], []
        t = 1
        while t < n:
            values.append(t)
            t *= 2
        values.append(n)
    return sorted(set(values))


def pool(
    file: str | None = file_option("Rack manifest: the pool, its interleave and pool.expect.", required=False),
    host: str | None = host_option("The manifest's host entry for this machine (default: by hostname)."),
    pool_path: str | None = typer.Option(
        None, "--pool", metavar="PATH", help="The pool's dax device (/dev/daxX.Y) or a scratch file (default: -f's)."
    ),
    threads: str = typer.Option(
        "1,2,4", "--threads", metavar="N,...", help="Thread counts, comma separated; a lone N: 1, 2, 4 ... N."
    ),
    size: str = typer.Option(
        "64MiB", "--size", metavar="SIZE", help="Bytes measured per device and for DRAM (e.g. 64MiB, 1GiB)."
    ),
    read_only: bool = typer.Option(
        False, "--read-only", help="Write nothing: reads of the shared KV area only (a pool in use)."
    ),
    repeat: int = typer.Option(
        3, "--repeat", metavar="N", help="Runs of each measurement (median latency, best GB/s)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
) -> None:
    """Latency, invalidated reads and non-temporal writes of each memory device and interleaved, beside DRAM.

    Writes only scratch space (a blank device or file, or the layout's unused tail); a pool a server
    here serves is refused unless --read-only. Lab figures are labelled emulated. Exit 2 for bad flags."""
    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.units import parse_size
    from belugactl.workflows.bench import pool_speed

    counts = parse_threads(threads)
    try:
        nbytes = parse_size(size)
    except (ValueError, TypeError):
        raise UsageError(f"--size {size}: expected a size such as 64MiB or 1GiB") from None
    if nbytes < 1 << 20:
        raise UsageError(f"--size {size}: at least 1MiB")
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if host is not None and file is None:
        raise UsageError("--host needs a manifest", fix="pass -f rack.yaml together with --host NAME")
    manifest = None
    expect = None
    if file is not None:
        from belugactl.cli.load_rack import rack_context

        rack = rack_context(file, host=host, pool=pool_path)
        manifest = rack.manifest
        expect = manifest.pool.expect
        path = rack.pool_path()
    elif pool_path is not None:
        path = pool_path
    else:
        raise UsageError(
            "bench pool needs the pool", fix="pass --pool /dev/daxX.Y (or a scratch file), or -f rack.yaml"
        )
    doc = pool_speed.bench_pool(
        path, manifest=manifest, threads=counts, size=nbytes, read_only=read_only, repeat=repeat
    )
    doc["expect"] = [v.to_dict() for v in pool_speed.compare(doc, expect)]
    if as_json:
        print_json(doc)
        return
    render(doc)


def _fmt(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def render(doc: dict[str, Any]) -> None:
    pool = doc["pool"]
    label = "EMULATED" if pool["emulated"] else ("file, not CXL" if pool["kind"] == "file" else "devdax")
    il = doc["interleave"]
    print(f"bench pool: {pool['path']} ({label}), {il['mode']}" + (f", {il['ways']} ways" if il["ways"] > 1 else ""))
    if pool["emulated_why"]:
        print(f"  emulated: {pool['emulated_why']}")
    access = pool["access"]
    print(f"  {access['mode']}: {access['area']}; latency by {doc['latency_method']}")
    head = f"  {'region':<12} {'thr':>3}  {'latency ns':>10} {'x DRAM':>7}  {'read GB/s':>9} {'x DRAM':>7}  "
    print(head + f"{'write GB/s':>10} {'x DRAM':>7}")
    memdevs = {r["name"]: r.get("memdev") for r in doc.get("regions", [])}
    for row in doc["rows"]:
        r = row.get("vs_dram", {})
        name = f"{row['region']} ({memdevs[row['region']]})" if memdevs.get(row["region"]) else row["region"]
        print(
            f"  {name:<12} {row['threads']:>3}  {_fmt(row['load_latency_ns']):>10} "
            f"{_fmt(r.get('load_latency'), 'x') if r else '':>7}  {_fmt(row['read_gb_per_s']):>9} "
            f"{_fmt(r.get('read'), 'x') if r else '':>7}  {_fmt(row['write_nt_gb_per_s']):>10} "
            f"{_fmt(r.get('write'), 'x') if r else '':>7}"
        )
    for note in doc["notes"]:
        print(f"  note: {note}")
    symbols = {"ok": "✓", "warn": "!", "skip": "-"}
    for v in doc.get("expect", []):
        print(f"  [{symbols[v['status']]}] expect {v['figure']}: {v['reason']}")
