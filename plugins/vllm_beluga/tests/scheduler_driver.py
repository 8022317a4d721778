"""Run inside the vLLM venv by test_scheduler.py: the connector's scheduler side with vLLM's real
config, Request and block hasher, against a real metadata server. Prints one JSON document."""

from __future__ import annotations

import json
import os
import sys

from driver_vllm import BS, Blocks, engine_config, request
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm_beluga.config import ConnectorConfigError
from vllm_beluga.connector import BelugaConnector

from belugactl.dataplane import native
from belugactl.dataplane.client import connect

model, address = sys.argv[1], sys.argv[2]


def config(algo: str = "sha256_cbor", address: str = address):
    return engine_config(model, address, algo)


out: dict[str, object] = {}
cfg = config()
os.environ.pop("PYTHONHASHSEED", None)
try:
    BelugaConnector(cfg, KVConnectorRole.SCHEDULER, None)
    out["unset_seed"] = "started"
except ConnectorConfigError as exc:
    out["unset_seed"] = str(exc)
os.environ["PYTHONHASHSEED"] = "0"
try:
    BelugaConnector(config("sha256"), KVConnectorRole.SCHEDULER, None)
    out["pickle_algo"] = "started"
except ConnectorConfigError as exc:
    out["pickle_algo"] = str(exc)

conn = BelugaConnector(cfg, KVConnectorRole.SCHEDULER, None)


tokens = list(range(10, 10 + 8 * BS))  # exactly 8 full blocks
r = request("r1", tokens)
keys = [bytes(h) for h in r.block_hashes]
out["hashes"] = len(keys)
client = connect(address)
ZEROS64 = native.crc32c(bytes(64))
out["empty"] = list(conn.get_num_new_matched_tokens(r, 0))
for key in keys[:5]:
    res = client.reserve(conn.namespace, key, 64)
    client.commit(res.token, ZEROS64)  # the test writes no bytes: a fresh pool's zeros
r2, r3, r4 = request("r2", tokens), request("r3", tokens), request("r4", tokens)
out["five_present"] = list(conn.get_num_new_matched_tokens(r2, 0))
out["five_present_two_local"] = list(conn.get_num_new_matched_tokens(r3, 2 * BS))
for key in keys[5:]:
    client.commit(client.reserve(conn.namespace, key, 64).token, ZEROS64)
trips = conn.index.round_trips
out["all_present"] = list(conn.get_num_new_matched_tokens(r4, 0))
out["switched_off"] = list(conn.get_num_new_matched_tokens(request("r5", tokens, {"beluga": {"load": False}}), 0))
out["counters"] = dict(conn.stats.counters)


# The lookups' leases (one per block found): the blocks to load keep theirs for the worker, which
# also hands back the hit's others (here the block holding the last token); a hit vLLM did not
# allocate, or a request finished first, gives its leases back at the next step.
out["leases_after_lookups"] = client.stats()["leases"]
conn.update_state_after_alloc(r4, Blocks(list(range(8))), 7 * BS)  # allocated: its 7 located blocks to the worker
out["hit_round_trips"] = conn.index.round_trips - trips
conn.update_state_after_alloc(r2, Blocks([]), 0)  # vLLM allocated nothing external
conn.request_finished(r3, [])  # finished (aborted) before any allocation
out["leases_before_step"] = client.stats()["leases"]
meta = conn.build_connector_meta(SchedulerOutput.make_empty())
# The step's release is sent without waiting: take its reply (the server handled it by then; its
# connection is served in order) before asking another connection for the count, which could
# otherwise be answered first.
conn.index._client.collect_replies()
out["leases_after_step"] = client.stats()["leases"]
out["located"] = [len([x for x in t.locations or [] if x is not None]) for t in meta.loads]
out["spare"] = [len(t.spare_leases) for t in meta.loads]
out["lookup_leases_released"] = conn.stats.counters.get("lookup_leases_released", 0)

down = BelugaConnector(config(address="tcp://127.0.0.1:1"), KVConnectorRole.SCHEDULER, None)
out["server_down"] = list(down.get_num_new_matched_tokens(request("r6", tokens), 0))
out["server_down_healthy"] = down.stats.state["healthy"]
print("RESULT " + json.dumps(out))
