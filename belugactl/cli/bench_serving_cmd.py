"""`belugactl bench kv` and `bench serve`: the KV copy engine and the serving stack, each against its baseline."""

from __future__ import annotations

import typer

from belugactl.cli.options import file_option


def register(bench: typer.Typer) -> None:
    bench.command("kv")(kv)
    bench.command("serve")(serve)


def kv(
    device: str = typer.Option(
        "cpu", "--device", metavar="cpu|cuda", help="cpu, or cuda (needs torch with CUDA and a GPU)."
    ),
    blocks: int = typer.Option(64, "--blocks", metavar="N", help="Blocks per batch (4 MiB each, Qwen-32B shaped)."),
    repeat: int = typer.Option(5, "--repeat", metavar="N", help="Timed repetitions (median)."),
    coherence: str = typer.Option(
        "none",
        "--coherence",
        metavar="none|flush",
        help="none, or flush: non-temporal saves and flush-before-load (shared write-back pool).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
) -> None:
    """Save/load Qwen-32B-shaped KV blocks (128 x 32 KiB pieces) vs one contiguous copy and a per-piece loop."""
    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.workflows.bench import kv_copy as bench_kv

    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: expected cpu or cuda")
    if coherence not in ("none", "flush"):
        raise UsageError(f"--coherence {coherence}: expected none or flush")
    if blocks < 1:
        raise UsageError("--blocks must be at least 1")
    if device == "cpu":
        doc = bench_kv.run_cpu(blocks, repeat=repeat, coherence=coherence)
    else:
        doc = bench_kv.run_cuda(blocks, repeat=repeat)
    if as_json:
        print_json(doc)
        return
    shape = doc["shape"]
    print(
        f"bench kv ({doc['device']}): {doc['blocks']} blocks x {shape['block_bytes'] >> 20} MiB "
        f"({shape['pieces_per_block']} pieces of {shape['piece_bytes'] >> 10} KiB), "
        f"coherence {doc.get('coherence', '-')}"
    )
    for name, r in doc["results"].items():
        print(f"  {name:<12} {r['gb_per_s']:7.2f} GB/s  {r['vs_contiguous']:5.2f}x of contiguous")
    print(f"  round trip ok: {doc['round_trip_ok']}; target: save and load >= 0.8x of contiguous")


def serve(
    manifest: str = file_option("Rack manifest (YAML) with two instances on this host."),
    pool: str = typer.Option(None, "--pool", metavar="PATH", help="Pool device or file (as for serve)."),
    create_pool: bool = typer.Option(False, "--create-pool", help="Create the --pool FILE if missing."),
    lengths: str = typer.Option(
        "1024,2048,4000", "--lengths", metavar="TOKENS,...", help="Prompt lengths in tokens, comma separated."
    ),
    rounds: int = typer.Option(3, "--rounds", metavar="N", help="Prompts per length (median)."),
    run_dir: str = typer.Option(
        None, "--run-dir", metavar="DIR", help="Use the serve running there, else start one there."
    ),
    vllm: str = typer.Option(None, "--vllm", metavar="PROGRAM", help="The vllm program (as for serve)."),
    via_router: bool = typer.Option(
        False, "--via-router", help="Also time every prompt through the front door (serve.router), side by side."
    ),
    engine_setting: str = typer.Option(
        None,
        "--engine-setting",
        metavar="default|4096|both",
        help="default (chunked prefill), 4096 (--max-num-batched-tokens 4096) or both (engines restarted between, "
        "one table each). Needs bench serve to start serve itself.",
    ),
    example_connector: bool = typer.Option(
        False,
        "--example-connector",
        help="Also start vLLM's ExampleConnector on B's argv and time its hit (one more engine start: minutes on CPU).",
    ),
    concurrent: int = typer.Option(
        0,
        "--concurrent",
        metavar="N",
        help="Also send N long prompts at once: throughput pool vs recompute (e.g. 16; 0: off).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
) -> None:
    """TTFT on instance B with the pool hit vs recompute, side by side (paper: 89.6 % lower; target >= 5x),
    beside B's local prefix-cache hit and, with --example-connector, vLLM's ExampleConnector hit."""
    import sys

    from belugactl.cli.load_rack import rack_context
    from belugactl.cli.render import print_json
    from belugactl.errors import UsageError
    from belugactl.workflows.bench import serving_engines as engines
    from belugactl.workflows.bench.serving_session import BenchOptions, run_sessions
    from belugactl.workflows.serve.control import status

    try:
        sizes = [int(x) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--lengths {lengths}: expected integers separated by commas") from None
    if not sizes or min(sizes) < 64:
        raise UsageError("--lengths: each prompt needs at least 64 tokens")
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if concurrent < 0:
        raise UsageError("--concurrent must be 0 (off) or a number of prompts")
    settings = engines.parse_settings(engine_setting) if engine_setting is not None else None

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    rack = rack_context(manifest, pool=pool)
    current = status(run_dir)
    if current["running"] and settings is not None:
        raise UsageError(
            f"--engine-setting {engine_setting}: serve is already running in {current['run_dir']}",
            why="each engine setting restarts the engines, and bench serve restarts only a serve it started",
            fix="belugactl stop (or give another --run-dir) and run bench serve again",
        )
    options = BenchOptions(
        lengths=sizes,
        rounds=rounds,
        via_router=via_router,
        example_connector=example_connector,
        concurrent=concurrent,
        run_dir=run_dir,
        vllm=vllm,
        create_pool=create_pool,
    )
    docs = run_sessions(rack, current, settings, options, say=say, on_doc=(lambda _: None) if as_json else print_table)
    if as_json:
        # The first setting's document at the top (the keys bench serve always had), every setting under "settings".
        print_json({**docs[0], "settings": docs})


def print_table(doc: dict) -> None:
    import sys

    from belugactl.workflows.bench.serving_report import baseline_lines

    if doc.get("engine_setting"):
        print(f"engine setting: {doc['engine_setting_label']}")
    print(f"{'prompt':>8} {'recompute':>11} {'pool hit':>10} {'speedup':>8} {'reduction':>10}  same tokens")
    for row in doc["rows"]:
        print(
            f"{row['prompt_tokens']:>8} {row['ttft_recompute_s']:>10.3f}s {row['ttft_pool_hit_s']:>9.3f}s "
            f"{row['speedup']:>7.1f}x {row['ttft_reduction_pct']:>9.1f}%  {row['same_tokens']}"
        )
        routed = row.get("via_router")
        if routed:
            print(
                f"{'  router':>8} {routed['ttft_recompute_s']:>10.3f}s {routed['ttft_pool_hit_s']:>9.3f}s "
                f"  (the front door adds {routed['router_cost_pool_hit_s'] * 1000:+.1f} ms to a pool hit)"
            )
    print("paper (Beluga, GPU, CXL): 89.6 % lower TTFT; target here: >= 5x")
    for line in baseline_lines(doc):
        print(line)
    sys.stdout.flush()
