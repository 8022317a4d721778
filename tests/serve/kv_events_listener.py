"""Run inside the vLLM venv by test_e2e_events_vllm.py: a KV-event subscriber, as a router's would be.

Binds a ZMQ SUB socket on the given loopback endpoint (vLLM's publisher, given a host:port endpoint,
connects to it), decodes vLLM's KVEventBatch messages and appends one JSON line per event to the
output file until killed or `limit_s` passes. Hashes are printed as vLLM published them (ints)
or as hex (bytes)."""

from __future__ import annotations

import json
import sys
import time

import msgspec
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


def _hash(h: object) -> object:
    return h.hex() if isinstance(h, (bytes, bytearray)) else h


def main() -> None:
    endpoint, out_path, limit_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.bind(endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    print("READY", flush=True)
    deadline = time.monotonic() + limit_s
    with open(out_path, "a") as out:
        while time.monotonic() < deadline:
            if not sub.poll(200):
                continue
            batch = decoder.decode(sub.recv_multipart()[-1])
            for e in batch.events:
                doc: dict[str, object] = {"type": type(e).__name__}
                if isinstance(e, BlockStored):
                    doc.update(
                        medium=e.medium,
                        hashes=[_hash(h) for h in e.block_hashes],
                        parent=_hash(e.parent_block_hash),
                        tokens=list(e.token_ids),
                        block_size=e.block_size,
                    )
                elif isinstance(e, BlockRemoved):
                    doc.update(medium=e.medium, hashes=[_hash(h) for h in e.block_hashes])
                elif not isinstance(e, AllBlocksCleared):
                    continue
                out.write(json.dumps(doc) + "\n")
                out.flush()
    sub.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
