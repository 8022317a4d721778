#!/usr/bin/env python3
"""Usage: .venv/bin/python scripts/measure-poison-scan.py 100000 1000000

How long the loop's poison work takes at a given index size: the one copy of the entries when a
chunk in use is quarantined, and one SCAN_STEP of the scan (median of the steps)."""
import gc
import statistics
import sys
import time
from types import SimpleNamespace

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.poison import SCAN_STEP, PoisonWatch

for n in [int(x) for x in sys.argv[1:]]:
    block = 64 << 10
    chunks = n * block // CHUNK + 2
    idx = KVIndex(Allocator(CHUNK, chunks * CHUNK), IndexConfig(high_watermark=1.0, low_watermark=0.99))
    ns = idx.open_namespace("m")
    for i in range(n):
        t, _ = idx.reserve(ns, i.to_bytes(32, "little"), block)
        idx.commit(t)
    g = SimpleNamespace(pool_size=(chunks + 1) * CHUNK, rpc_offset=0, ring_count=0, ring_stride=0, journal_offset=0,
                        journal_size=0, shared_kv_offset=CHUNK, shared_kv_size=chunks * CHUNK)
    gc.freeze()  # as the server's loop does (server.py serve_forever)
    gc.set_threshold(100_000, 50, 50)
    w = PoisonWatch(idx, g, log=lambda m: None)
    victim = idx.entries[(ns, (n // 2).to_bytes(32, "little"))].alloc.extents[0][0]
    w.submit([(victim, 64)], "measure")
    t0 = time.perf_counter()
    w._apply_inbox()
    copy = time.perf_counter() - t0
    steps = []
    while w.busy:
        t0 = time.perf_counter()
        w.step()
        steps.append(time.perf_counter() - t0)
    print(f"{n} entries: copy {copy * 1e3:.1f} ms, step of {SCAN_STEP}: median {statistics.median(steps) * 1e3:.2f} ms,"
          f" max {max(steps) * 1e3:.2f} ms, {len(steps)} steps, dropped {w.counters['blocks_dropped']}")
