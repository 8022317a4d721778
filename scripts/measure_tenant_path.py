#!/usr/bin/env python3
"""The Python request path's cost in-process (no transport), for before/after comparisons of the
index and service (docs/measurements.md, 2026-12-05 "tenants on the fast path").

Per pair of requests: LOOKUP_PREFIX hit + RELEASE, GET_MANY of 8 keys + RELEASE, RESERVE + COMMIT;
CPU time (process_time: less sensitive to a loaded machine than wall time), the minimum of 9 runs.
Run it with PYTHONPATH at each tree to compare, alternating: `PYTHONPATH=/tmp/base python
scripts/measure_tenant_path.py base`.
"""

from __future__ import annotations

import sys
import time

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import KVIndex
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Op

OWNER = 5


def main() -> None:
    idx = KVIndex(Allocator(CHUNK, 512 * CHUNK))
    s = MetadataService(idx, epoch=1)
    if hasattr(idx, "set_rings"):
        idx.set_rings(16)  # as a real server: the lease room kept
    ns = idx.open_namespace("m")
    keys = [i.to_bytes(32, "little") for i in range(4096)]
    for k in keys:
        t, _ = idx.reserve(ns, k, 16384, 0)
        idx.commit(t, 0, 1)
    look = [p.encode_lookup(ns, [k]) for k in keys]
    many = [p.encode_lookup(ns, keys[i : i + 8]) for i in range(0, 4096, 8)]
    fresh = iter(range(10_000_000, 1 << 62))

    def call(op: int, payload: bytes) -> bytes:
        idx.begin_request(OWNER)
        try:
            return s.handle(op, 1, payload, 4096, OWNER)[1]
        finally:
            idx.end_request()

    def lookup(n: int = 20000) -> float:
        t0 = time.process_time_ns()
        for i in range(n):
            lease = p.decode_lookup_reply(call(Op.LOOKUP_PREFIX, look[i & 4095]))[1]
            call(Op.RELEASE, p.encode_release([lease]))
        return (time.process_time_ns() - t0) / n

    def get_many(n: int = 5000) -> float:
        t0 = time.process_time_ns()
        for i in range(n):
            ids = [it[0] for it in p.decode_get_many_reply(call(Op.GET_MANY, many[i % len(many)]))]
            call(Op.RELEASE, p.encode_release(ids))
        return (time.process_time_ns() - t0) / n

    def put(n: int = 5000) -> float:
        t0 = time.process_time_ns()
        for _ in range(n):
            k = next(fresh).to_bytes(32, "little")
            token = p.decode_reserve_reply(call(Op.RESERVE, p.encode_reserve(ns, k, 16384)))[0]
            call(Op.COMMIT, p.encode_commit(token, 1))
        return (time.process_time_ns() - t0) / n

    out = {name: min(f() for _ in range(9)) for name, f in (
        ("lookup+release", lookup), ("get_many8+release", get_many), ("reserve+commit", put),
    )}  # fmt: skip
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    print(label, " ".join(f"{k}={v:.0f}ns" for k, v in out.items()))


if __name__ == "__main__":
    main()
