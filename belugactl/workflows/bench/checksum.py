"""Throughput of the block checksum beside a plain copy, its baseline: `belugactl bench checksum`.

Measures GB/s for CRC32C alone, a plain copy (`native.copy`), the one-pass copy+CRC32C
(`native.copy_crc32c`) and a copy followed by a CRC pass, per buffer size (in cache, past it), and
the kernel in use. Best of three timed rounds, each about 0.5 GB of traffic (a noisy shared host
makes the best round the honest one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from belugactl.dataplane import native

SIZES = (256 << 10, 2 << 20, 64 << 20)


def _rate(fn: Callable[[], object], nbytes: int, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, time.perf_counter() - t)
    return round(reps * nbytes / best / 1e9, 2)


def measure(sizes: tuple[int, ...] = SIZES, traffic: int = 512 << 20) -> dict[str, object]:
    rows = []
    for size in sizes:
        src = os.urandom(size)
        dst = bytearray(size)
        reps = max(3, traffic // size) if native.AVAILABLE else 1
        rows.append(
            {
                "bytes": size,
                "crc32c_gbps": _rate(lambda s=src: native.crc32c(s), size, reps),
                "copy_gbps": _rate(lambda d=dst, s=src, n=size: native.copy(d, 0, s, 0, n), size, reps),
                "copy_crc32c_gbps": _rate(lambda d=dst, s=src, n=size: native.copy_crc32c(d, 0, s, 0, n), size, reps),
                "copy_then_crc32c_gbps": _rate(
                    lambda d=dst, s=src, n=size: (native.copy(d, 0, s, 0, n), native.crc32c(d)), size, reps
                ),
            }
        )
        row = rows[-1]
        # What verifying costs a load: the one-pass copy's speed as a share of a plain copy's (1.0: free).
        row["fused_over_copy"] = round(row["copy_crc32c_gbps"] / row["copy_gbps"], 2) if row["copy_gbps"] else 0.0
    return {"kernel": native.CRC32C_KERNEL, "native": native.AVAILABLE, "sizes": rows}

