"""Run inside the vLLM venv by test_scheduler.py: the scheduler's lookup started when a request
arrives (`on_new_request`) and taken when vLLM schedules it, with vLLM's real config, Request and
block hasher, over a real metadata server's CXL-RPC ring. Prints one JSON document.

argv: model, the server's TCP address (to set blocks up and count leases), the scheduler's ring."""

from __future__ import annotations

import json
import os
import sys
import time

from driver_vllm import BS, Blocks, engine_config, request
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm_beluga.connector import BelugaConnector
from vllm_beluga.scheduler import LOOKUP_FRESH_S

from belugactl.dataplane import native
from belugactl.dataplane.client import connect

model, tcp, ring = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["PYTHONHASHSEED"] = "0"


def config(**extra):
    return engine_config(model, ring, **extra)


client = connect(tcp)
ZEROS64 = native.crc32c(bytes(64))  # the test writes no bytes: each block is a fresh pool's zeros


def leases(want: int | None = None) -> int:
    """The server's live leases (waiting up to 2 s for `want`: a request sent without waiting is read at once,
    but on another connection than this count's)."""
    deadline = time.monotonic() + 2
    while True:
        held = client.stats()["leases"]
        if want is None or held == want or time.monotonic() > deadline:
            return held
        time.sleep(0.01)


out: dict[str, object] = {}
conn = BelugaConnector(config(), KVConnectorRole.SCHEDULER, None)
plain = BelugaConnector(config(post_lookups=False), KVConnectorRole.SCHEDULER, None)
out["lookup_on_arrival"] = [conn.connector_scheduler.lookup_on_arrival, plain.connector_scheduler.lookup_on_arrival]
tokens = list(range(10, 10 + 8 * BS))  # exactly 8 full blocks
keys = [bytes(h) for h in request("r0", tokens).block_hashes]
for key in keys[:5]:
    client.commit(client.reserve(conn.namespace, key, 64).token, ZEROS64)

# Started on arrival: the server grants the leases before vLLM asks; the answer is the one asked now.
r1 = request("r1", tokens)
conn.on_new_request(r1)
out["leases_after_post"] = leases(5)
trips = conn.index.round_trips
out["early_answer"] = list(conn.get_num_new_matched_tokens(r1, 0))
out["early_trips"] = conn.index.round_trips - trips
p1 = request("p1", tokens)
plain.on_new_request(p1)
out["plain_answer"] = list(plain.get_num_new_matched_tokens(p1, 0))
conn.update_state_after_alloc(r1, Blocks(list(range(8))), 5 * BS)
meta = conn.build_connector_meta(SchedulerOutput.make_empty())
out["located"] = [len([x for x in t.locations or [] if x is not None]) for t in meta.loads]

# Stale: a request that waited longer than LOOKUP_FRESH_S is asked again, and sees the
# blocks saved meanwhile; its first answer's leases are released.
r2 = request("r2", tokens)
conn.on_new_request(r2)
for key in keys[5:]:
    client.commit(client.reserve(conn.namespace, key, 64).token, ZEROS64)
time.sleep(LOOKUP_FRESH_S + 0.1)
out["stale_answer"] = list(conn.get_num_new_matched_tokens(r2, 0))
conn.update_state_after_alloc(r2, Blocks([]), 0)  # vLLM allocated nothing external

# Aborted before vLLM ever scheduled it: the answer is taken and its leases released.
r3 = request("r3", tokens)
conn.on_new_request(r3)
conn.request_finished(r3, [])
# Switched off by the request: nothing is sent.
r4 = request("r4", tokens, {"beluga": {"load": False}})
conn.on_new_request(r4)
out["switched_off"] = list(conn.get_num_new_matched_tokens(r4, 0))

# Several arrive at once, scheduled in another order: each gets its own answer.
many = [request(f"m{i}", tokens) for i in range(6)]
for r in many:
    conn.on_new_request(r)
out["many"] = [list(conn.get_num_new_matched_tokens(r, 0)) for r in reversed(many)]
for r in many:
    conn.update_state_after_alloc(r, Blocks([]), 0)
conn.build_connector_meta(SchedulerOutput.make_empty())
conn.index._client.collect_replies()
plain.update_state_after_alloc(p1, Blocks([]), 0)
plain.build_connector_meta(SchedulerOutput.make_empty())
plain.index._client.collect_replies()
# Left: r1's 5 blocks to load, kept for the worker, plus r1's spare (none: 5 of 8 found, all loaded).
out["leases_left"] = leases(5)
c = conn.stats.counters
out["counters"] = {k: c.get(k, 0) for k in ("lookups_posted", "lookups_posted_used", "lookups_posted_dropped")}
out["timed"] = {k: k in c for k in ("lookup_post_us", "lookup_us", "lookup_dropped_us")}
print("RESULT " + json.dumps(out))
