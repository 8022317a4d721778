"""Run inside the vLLM venv by test_overlap_vllm.py: the real CPU engine (scheduler and worker in this
one process) with the Beluga connector, a real metadata server and a file pool. Prints one JSON line.

It records when vLLM's block pool puts a block back on its free list and when each asynchronous save
was queued and finished, and counts frees of a block while a save of it was still pending:
- "held": the connector as shipped (request_finished holds a request's blocks for its saves);
- "control": the same with that hold switched off, to show the driver sees the violation it tests for;
then loads a saved prompt back, layer by layer, and compares the greedy tokens with a recompute.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # scheduler and worker in this process: both patched
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["PYTHONHASHSEED"] = "0"

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm_beluga import overlap, transfer  # noqa: E402
from vllm_beluga.connector import BelugaConnector  # noqa: E402

model, address, pool_path = sys.argv[1], sys.argv[2], sys.argv[3]
SAVE_DELAY_S = 0.6
BS = 32

frees: list[tuple[float, list[int]]] = []
saves: list[dict[str, object]] = []
lock = threading.Lock()

original_free = BlockPool.free_blocks


def free_blocks(self, ordered_blocks):  # noqa: ANN001, ANN201
    blocks = list(ordered_blocks)
    original_free(self, blocks)
    now = time.monotonic()
    with lock:
        frees.append((now, [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null]))


BlockPool.free_blocks = free_blocks

original_submit = overlap.AsyncSaves.submit


def submit(self, req_id, block_ids, keys):  # noqa: ANN001, ANN201
    record = {"req": req_id, "blocks": list(block_ids), "queued": time.monotonic(), "done": None}
    with lock:
        saves.append(record)
    future = original_submit(self, req_id, block_ids, keys)
    future.add_done_callback(lambda _f: record.__setitem__("done", time.monotonic()))
    return future


overlap.AsyncSaves.submit = submit

original_save = transfer.PoolTransfer.save


def slow_save(self, block_ids, keys):  # noqa: ANN001, ANN201
    time.sleep(SAVE_DELAY_S)  # a slow pool: the window in which the blocks must stay untouched
    return original_save(self, block_ids, keys)


transfer.PoolTransfer.save = slow_save


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def violations(since: int) -> dict[str, int]:
    """Frees of a block while a save of it was pending, over the saves queued from index `since`."""
    bad = 0
    with lock:
        phase = saves[since:]
        for s in phase:
            end = s["done"] if s["done"] is not None else float("inf")
            for t, ids in frees:
                if s["queued"] <= t < end:
                    bad += len(set(ids) & set(s["blocks"]))
    return {"violations": bad, "saves": len(phase)}


kv = {
    "kv_connector": "BelugaConnector",
    "kv_connector_module_path": "vllm_beluga.connector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
    "kv_connector_extra_config": {
        "metadata_address": address,
        "pool_path": pool_path,
        "hash_seed": "0",
        "namespace": "overlap-driver",
        "layerwise_loads": True,  # the machinery under test; "auto" copies whole on a CPU engine
    },
}
llm = LLM(
    model=model, load_format="dummy", skip_tokenizer_init=True, block_size=BS, enable_prefix_caching=False,
    prefix_caching_hash_algo="sha256_cbor", max_model_len=2048, max_num_seqs=4, seed=0, kv_transfer_config=kv,
    enforce_eager=True,  # no compilation: what is tested is the connector, not the model's speed
)  # fmt: skip


def phase(name: str, seed: int) -> list[int]:  # noqa: ARG001 - named for the reader
    """A short request that finishes at once (its save pending) beside a long one that keeps the
    engine stepping, and so freeing, while that save is still reading."""
    short = {"prompt_token_ids": tokens(10 * BS, seed)}
    long = {"prompt_token_ids": tokens(2 * BS, seed + 1)}
    params = [
        SamplingParams(max_tokens=1, temperature=0),
        SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
    ]
    out = llm.generate([short, long], params, use_tqdm=False)
    # Any later step reports the finished saves; one more tiny request drives the engine past them.
    time.sleep(SAVE_DELAY_S * 2)
    llm.generate([{"prompt_token_ids": tokens(8, seed + 2)}], SamplingParams(max_tokens=2), use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


result: dict[str, object] = {}
mark = len(saves)
phase("held", 11)
result["held"] = violations(mark)

# Control: vLLM frees at finish, as a connector that saves synchronously would ask.
BelugaConnector.request_finished = lambda self, request, block_ids: (False, None)
BelugaConnector.get_finished = lambda self, finished_req_ids: (None, None)
mark = len(saves)
phase("control", 23)
result["control"] = violations(mark)

# Layer-wise loads: the "held" phase's short prompt is in the pool; load it, and recompute it.
prompt = {"prompt_token_ids": tokens(10 * BS, 11)}
greedy = SamplingParams(max_tokens=6, temperature=0)
switched_off = {"kv_transfer_params": {"beluga": {"load": False, "save": False}}}
off = SamplingParams(max_tokens=6, temperature=0, extra_args=switched_off)
recomputed = llm.generate([prompt], off, use_tqdm=False)[0].outputs[0].token_ids
loaded = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
from vllm.distributed.kv_transfer import get_kv_transfer_group  # noqa: E402

worker = get_kv_transfer_group()
counters = dict(worker.stats.counters)
result["tokens_equal"] = list(recomputed) == list(loaded)
result["tokens"] = list(loaded)
result["counters"] = {k: counters.get(k, 0) for k in (
    "layerwise_loads", "layer_waits", "loaded_blocks", "load_errors", "async_saves", "saved_blocks",
    "save_skipped_exists")}  # fmt: skip
engine = worker.connector_worker.engine
result["num_layers"] = len(engine.layer_spans) if engine is not None else None
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)  # skip the engine's slow teardown; the test stops the server
