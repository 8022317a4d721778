"""`belugactl bench overlap`: the connector's copies overlapped with the forward pass vs synchronous."""

from __future__ import annotations

import typer


def register(bench: typer.Typer) -> None:
    bench.command("overlap")(overlap)


def overlap(
    lengths: str = typer.Option(
        "4000", "--lengths", metavar="TOKENS,...", help="Prompt lengths in tokens, comma separated."
    ),
    rounds: int = typer.Option(3, "--rounds", metavar="N", min=1, max=50, help="Prompts per length (median)."),
    vllm_python: str = typer.Option(
        None,
        "--vllm-python",
        metavar="PROGRAM",
        help="Python of the vLLM environment (default: .venv-vllm beside this checkout).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
) -> None:
    """Miss and pool-hit time with asynchronous saves and layer-wise loads vs synchronous copies (CPU engine)."""
    import sys
    from pathlib import Path

    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.workflows.bench import overlap as bench_overlap

    try:
        sizes = [int(x) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--lengths {lengths}: expected integers separated by commas") from None
    if not sizes or min(sizes) < 64 or max(sizes) > 8000:
        raise UsageError("--lengths: each prompt between 64 and 8000 tokens (the demo model's context)")
    python = vllm_python or str(bench_overlap.REPO / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        raise UsageError(f"--vllm-python {python}: not found", fix="run scripts/bootstrap-vllm, or name the python")

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    doc = bench_overlap.run(python, lengths=sizes, rounds=rounds, say=say)
    if as_json:
        print_json(doc)
        return
    print(f"{'prompt':>8} {'':>10} {'sync':>9} {'overlap':>9} {'ratio':>7}")
    for row in doc["rows"]:
        s, o = row["sync"], row["overlap"]
        tokens = row["prompt_tokens"]
        print(f"{tokens:>8} {'miss':>10} {s['miss_s']:>8.3f}s {o['miss_s']:>8.3f}s {row['miss_ratio']:>6.2f}x")
        print(f"{'':>8} {'pool hit':>10} {s['hit_s']:>8.3f}s {o['hit_s']:>8.3f}s {row['hit_ratio']:>6.2f}x")
        print(f"{'':>8} {'recompute':>10} {s['recompute_s']:>8.3f}s {o['recompute_s']:>8.3f}s")
    c = doc["counters"]["overlap"]
    print(
        f"overlap run: {c['async_saves']} asynchronous saves, {c['layerwise_loads']} layer-wise loads, "
        f"{c['layer_waits']} layer waits ({c['layer_wait_us'] / 1000:.1f} ms waited in all), "
        f"{c['loaded_blocks']} blocks loaded, {c['load_errors']} load errors"
    )
    print("ratio = overlap / sync (below 1: the overlap took time off the request)")
