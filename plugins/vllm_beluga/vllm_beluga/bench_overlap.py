"""One side of `belugactl bench overlap`, run in the vLLM environment: the real engine (scheduler and
worker in this process) with the Beluga connector, its copies either overlapped (asynchronous saves,
layer-wise loads: the default) or synchronous (both switched off), timing per prompt:
- miss: a fresh prompt, computed and saved (what a save on the critical path costs the first token);
- hit: the same prompt again, its blocks loaded from the pool (vLLM's own prefix cache is off);
- recompute: the same prompt with the connector off for the request.
Prints one JSON line, `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--scheduler-address", default=None)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--setting", choices=("overlap", "sync"), required=True)
    ap.add_argument("--lengths", default="4000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    overlap = args.setting == "overlap"
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    kv = {
        "kv_connector": "BelugaConnector",
        "kv_connector_module_path": "vllm_beluga.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "metadata_address": args.address,
            "scheduler_address": args.scheduler_address or args.address,
            "pool_path": args.pool,
            "hash_seed": os.environ.get("PYTHONHASHSEED", "0"),
            "namespace": f"bench-overlap-{args.setting}",
            "async_saves": overlap,
            "layerwise_loads": overlap,
        },
    }
    llm = LLM(
        model=args.model, load_format="dummy", skip_tokenizer_init=True, block_size=32, enable_prefix_caching=False,
        prefix_caching_hash_algo="sha256_cbor", max_model_len=max(lengths) + 64, max_num_seqs=4, seed=0,
        kv_transfer_config=kv,
    )  # fmt: skip
    worker = get_kv_transfer_group()
    one = SamplingParams(max_tokens=1, temperature=0)
    off = SamplingParams(
        max_tokens=1, temperature=0, extra_args={"kv_transfer_params": {"beluga": {"load": False, "save": False}}}
    )

    def timed(prompt: list[int], params: SamplingParams) -> float:
        time.sleep(args.settle)  # start each timed request on a quiet machine
        started = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return time.perf_counter() - started

    # Untimed first: the first requests pay for compilation and allocation, not for the connector.
    first = [random.Random(7).randrange(3, 1000) for _ in range(256)]
    timed(first, one)
    timed(first, one)
    worker.connector_worker.drain_saves()
    before = dict(worker.stats.counters)  # what the timed prompts did, not the untimed first ones
    rows = []
    for length in lengths:
        miss, hit, recompute = [], [], []
        for r in range(args.rounds):
            rng = random.Random(args.seed * 1_000_003 + length * 1000 + r)
            prompt = [rng.randrange(3, 1000) for _ in range(length)]
            miss.append(timed(prompt, one))
            worker.connector_worker.drain_saves()  # the hit below must find every block, whatever the setting
            hit.append(timed(prompt, one))
            recompute.append(timed(prompt, off))
        rows.append(
            {
                "prompt_tokens": length,
                "miss_s": statistics.median(miss),
                "hit_s": statistics.median(hit),
                "recompute_s": statistics.median(recompute),
                "samples": {"miss_s": miss, "hit_s": hit, "recompute_s": recompute},
            }
        )
    worker.connector_worker.drain_saves()
    counters = {k: v - before.get(k, 0) for k, v in worker.stats.counters.items()}
    doc = {
        "setting": args.setting,
        "rows": rows,
        "counters": {
            k: counters.get(k, 0)
            for k in (
                "loaded_blocks", "load_errors", "saved_blocks", "async_saves", "layerwise_loads", "layer_waits",
                "layer_wait_us", "load_us", "save_us",
            )
        },  # fmt: skip
    }
    print("RESULT " + json.dumps(doc), flush=True)
    os._exit(0)  # the engine's teardown is slow and says nothing


if __name__ == "__main__":
    main()
