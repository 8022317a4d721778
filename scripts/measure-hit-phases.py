"""Where a pool hit's time goes inside one vLLM engine process (scheduler and worker together), against
vLLM's own local prefix-cache hit of the same prompt, round by round: the CPU demo model, 4000-token
prompts, `--max-num-batched-tokens 4096`.

Each round sends a fresh prompt (computed and saved), then the same prompt again (vLLM's local hit),
then, with vLLM's prefix cache reset, again (the connector's hit), and times per request: the
scheduler's `schedule`, the connector's lookup (`get_num_new_matched_tokens`), the worker's
`start_load_kv`, and the model's forward pass. `--connector example` runs vLLM's ExampleConnector
instead (its hit read from files). `--drop-page-tables` drops this process's page-table entries of
the pool before each hit, as a worker has them for blocks another instance saved (what the
connector's prefault, vllm_beluga/prefault.py, fills in ahead; `--no-prefault` turns that off); the
minor faults per hit are printed.

Run with the vLLM environment's Python, from the repository root (it starts its own metadata
server on a fresh file pool with belugactl's Python):
    .venv-vllm/bin/python scripts/measure-hit-phases.py [--connector beluga|example]
        [--layerwise-loads auto|true|false] [--rounds 9] [--drop-page-tables] [--no-prefault]
Prints one line, `RESULT {json}`. Saves are synchronous here (`async_saves` false): an asynchronous
save holds the request's blocks until the next engine step, and vLLM's prefix cache cannot be reset
while they are held.
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "examples" / "models" / "llama-cpu-demo"
DEMO = REPO / "examples" / "cpu-demo.yaml"
BELUGACTL_PYTHON = REPO / ".venv" / "bin" / "python"

SERVER = """
import sys, time
from pathlib import Path
from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.bench.rpc_mds import running_server
pool, demo = Path(sys.argv[1]), Path(sys.argv[2])
create_file_pool(pool, demo)
with running_server(demo, pool) as record:
    print("READY", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
"""


def _timer(totals: dict[str, float], obj: Any, name: str, key: str) -> None:
    """Add the wall time of every `obj.name(...)` call to totals[key]."""
    inner: Callable[..., Any] = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - started

    setattr(obj, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connector", choices=("beluga", "example"), default="beluga")
    ap.add_argument("--layerwise-loads", choices=("auto", "true", "false"), default="auto")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--drop-page-tables", action="store_true")
    ap.add_argument("--no-prefault", action="store_true", help="prefault_max_bytes 0: the connector as before")
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # scheduler and worker in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with tempfile.TemporaryDirectory(prefix="hit-phases-") as tmp:
        pool = Path(tmp) / "pool"
        server = None
        if args.connector == "beluga":
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            server = subprocess.Popen(  # noqa: S603 - argv list, our own code
                [str(BELUGACTL_PYTHON), "-c", SERVER, str(pool), str(DEMO)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            assert server.stdout is not None
            if server.stdout.readline().strip() != "READY":
                sys.exit("the metadata server did not start")
        try:
            run(args, pool, Path(tmp))
        finally:
            if server is not None and server.stdin is not None:
                server.stdin.close()
                server.wait(10)


def run(args: argparse.Namespace, pool: Path, tmp: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    if args.connector == "beluga":
        layerwise: object = {"auto": "auto", "true": True, "false": False}[args.layerwise_loads]
        kv = {
            "kv_connector": "BelugaConnector",
            "kv_connector_module_path": "vllm_beluga.connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "metadata_address": f"cxl://{pool}#1",
                "scheduler_address": f"cxl://{pool}#0",
                "pool_path": str(pool),
                "hash_seed": "0",
                "namespace": "hit-phases",
                "layerwise_loads": layerwise,
                "async_saves": False,
                "prefault_max_bytes": 0 if args.no_prefault else 16 << 30,
            },
        }
    else:
        kv = {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp / "example")},
        }
    llm = LLM(
        model=str(MODEL), load_format="dummy", skip_tokenizer_init=True, block_size=32, enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor", max_model_len=4096, max_num_seqs=4, seed=0,
        max_num_batched_tokens=4096, kv_transfer_config=kv,
    )  # fmt: skip
    totals: dict[str, float] = collections.defaultdict(float)
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    worker = get_kv_transfer_group()
    _timer(totals, core.scheduler, "schedule", "schedule")
    _timer(totals, core.scheduler.connector, "get_num_new_matched_tokens", "lookup")
    _timer(totals, worker, "start_load_kv", "start_load_kv")
    _timer(totals, runner, "_model_forward", "forward")
    one = SamplingParams(max_tokens=1, temperature=0)

    def request(prompt: list[int]) -> tuple[float, dict[str, float], int]:
        time.sleep(0.5)  # start on a quiet machine
        totals.clear()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], one, use_tqdm=False)
        took = time.perf_counter() - started
        return took, dict(totals), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    def reset() -> None:
        for _ in range(50):
            if llm.reset_prefix_cache():
                return
            time.sleep(0.1)
        sys.exit("vLLM's prefix cache could not be reset (blocks still held)")

    rng = random.Random(1)
    warm = [rng.randrange(3, 1000) for _ in range(args.tokens)]
    request(warm)
    reset()
    request(warm)
    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        prompt = [rng.randrange(3, 1000) for _ in range(args.tokens)]
        request(prompt)  # computed, saved
        local_s, local_phases, _ = request(prompt)
        reset()
        if args.drop_page_tables and args.connector == "beluga":
            worker._pool._mm.madvise(mmap.MADV_DONTNEED)  # this process's mapping only; the bytes stay
        hit_s, hit_phases, faults = request(prompt)
        reset()
        rows.append({"local_s": local_s, "hit_s": hit_s, "local": local_phases, "hit": hit_phases, "faults": faults})

    def med(values: list[float]) -> float:
        return round(statistics.median(values) * 1e3, 2)

    keys = sorted({k for r in rows for k in (*r["local"], *r["hit"])})
    summary = {
        "connector": args.connector,
        "layerwise_loads": args.layerwise_loads if args.connector == "beluga" else None,
        "drop_page_tables": args.drop_page_tables,
        "prefault": not args.no_prefault,
        "rounds": args.rounds,
        "local_hit_ms": med([r["local_s"] for r in rows]),
        "hit_ms": med([r["hit_s"] for r in rows]),
        "hit_above_local_ms": med([r["hit_s"] - r["local_s"] for r in rows]),
        "phases_local_ms": {k: med([r["local"].get(k, 0.0) for r in rows]) for k in keys},
        "phases_hit_ms": {k: med([r["hit"].get(k, 0.0) for r in rows]) for k in keys},
        "minor_faults_per_hit": statistics.median(r["faults"] for r in rows),
    }
    print("RESULT " + json.dumps(summary), flush=True)  # vLLM logs to stdout too


if __name__ == "__main__":
    main()
