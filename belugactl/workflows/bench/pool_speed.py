"""The pool's own speed beside local DRAM (`belugactl bench pool`, issue 33 item 3; the command itself is
not registered yet): per region, the load latency of a dependent pointer chase, the read bandwidth with
each line invalidated first, and the write bandwidth with non-temporal stores, at 1 to N threads.

The kernels are the native helper's (`_native_bench.c`); they overwrite the bytes they measure, so a
region given here must be scratch space (a pool no server uses). A region is (name, offset, length)
of one buffer: a memory device's slice of the pool, the interleaved whole, or an anonymous mapping
for DRAM. Figures from the lab's emulated devices are the emulator's, and `emulated` says so.
"""

from __future__ import annotations

import mmap
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from belugactl.dataplane import native

LINE = 64


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    length: int


def _kernels() -> Any:  # noqa: ANN401 - the C module
    mod = native._native
    if mod is None or not hasattr(mod, "bench_chase"):
        raise RuntimeError(f"bench pool needs the native helper: {native.MISSING_WHY}. Fix: {native.MISSING_FIX}")
    return mod


def _slices(region: Region, threads: int) -> list[tuple[int, int]]:
    """`threads` line-aligned slices of the region, one per thread."""
    each = (region.length // threads) & ~(4096 - 1)
    if each < 2 * 4096:
        raise ValueError(f"region {region.name} ({region.length} bytes) is too small for {threads} threads")
    return [(region.offset + i * each, each) for i in range(threads)]


def measure(buf: Any, region: Region, threads: int, *, chase_steps: int = 200_000, repeat: int = 3) -> dict[str, Any]:
    """One region at one thread count: latency (one thread, the median of `repeat` chases) and the
    read and write bandwidths of `threads` threads side by side (the slowest thread's time)."""
    k = _kernels()
    if region.offset % LINE:
        raise ValueError(f"region {region.name} starts at {region.offset}, not on a cache line")
    chase_len = min(region.length, 64 << 20) & ~(LINE - 1)
    latency = statistics.median(k.bench_chase(buf, region.offset, chase_len, chase_steps, 7 + i) for i in range(repeat))
    slices = _slices(region, threads)
    total = sum(n for _, n in slices)
    with ThreadPoolExecutor(threads) as pool:
        write_ns = min(max(pool.map(lambda s: k.bench_write_nt(buf, s[0], s[1]), slices)) for _ in range(repeat))
        read_ns = min(max(pool.map(lambda s: k.bench_read(buf, s[0], s[1], True), slices)) for _ in range(repeat))
    return {
        "region": region.name,
        "threads": threads,
        "bytes": total,
        "load_latency_ns": round(latency, 1),
        "read_gb_per_s": round(total / read_ns, 2),
        "write_nt_gb_per_s": round(total / write_ns, 2),
    }


def run(
    buf: Any, regions: list[Region], *, threads: list[int], dram_bytes: int, emulated: bool, repeat: int = 3
) -> dict[str, Any]:
    """Every region at every thread count, and local DRAM (an anonymous mapping) the same way."""
    rows: list[dict[str, Any]] = []
    dram = mmap.mmap(-1, dram_bytes)
    try:
        for t in threads:
            rows.append(measure(dram, Region("dram", 0, dram_bytes), t, repeat=repeat))
            rows.extend(measure(buf, r, t, repeat=repeat) for r in regions)
    finally:
        dram.close()
    return {"emulated": emulated, "threads": threads, "rows": rows}
