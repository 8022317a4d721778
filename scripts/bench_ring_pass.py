"""A look for a request with none waiting, at each ring count: every ring's 2 status words (`rpc_take`,
what the fast path's pass reads) against the doorbells (`bells_take`), without and with a flush per line.

    .venv/bin/python scripts/bench_ring_pass.py

Private anonymous memory laid out as a pool (doorbells at 1 MiB, rings from 2 MiB); best of 5 runs,
microseconds per look, the Python call (~0.2 us) included. Dated figures: docs/measurements.md.
"""

import mmap
import time
from array import array

from belugactl.dataplane import native

n = native._native
SLOT, SLOTS = 256, 256
for rings in (16, 128, 512, 1152):
    stride = SLOT * SLOTS
    mm = mmap.mmap(-1, (2 << 20) + rings * stride)
    buf = memoryview(mm)
    offs = array("q", [(2 << 20) + r * stride for r in range(rings)] * 2)
    res = {}
    for flush in (False, True):
        state = n.bells_new(rings, 1 << 20, 10**8 // rings)
        n.bells_take(buf, offs, state, SLOT - 32, 0, flush)  # the first look: every ring once
        every = bells = 1e9
        for _ in range(5):
            k = 2000
            t0 = time.perf_counter_ns()
            for _ in range(k):
                n.bells_take(buf, offs, state, SLOT - 32, 0, flush)
            bells = min(bells, (time.perf_counter_ns() - t0) / k / 1000)
            k = max(20, 200000 // rings)
            t0 = time.perf_counter_ns()
            for _ in range(k):
                n.rpc_take(buf, offs, 0, SLOT - 32, 0, flush)
            every = min(every, (time.perf_counter_ns() - t0) / k / 1000)
        res["flush" if flush else "none"] = f"every ring {every:.2f} us, doorbells {bells:.2f} us"
    print(rings, "rings:", res)
    buf.release()
    mm.close()
