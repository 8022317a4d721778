"""The pool speed kernels (`_native_bench.c`) and `workflows/bench/pool_speed.py`, on anonymous memory:
what they compute and refuse is checked, the figures themselves are not (no wall-clock asserts)."""

from __future__ import annotations

import ctypes
import mmap

import pytest

from belugactl.dataplane import native
from belugactl.workflows.bench import pool_speed
from belugactl.workflows.bench.pool_speed import Region

pytestmark = pytest.mark.native


def test_the_chase_links_every_line_of_the_range_into_one_cycle() -> None:
    buf = mmap.mmap(-1, 1 << 16)
    assert native._native.bench_chase(buf, 0, 1 << 14, 1000) > 0
    # The chain lies in the buffer (absolute addresses): follow it round once.
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    seen, cur = set(), addr
    for _ in range((1 << 14) // 64):
        seen.add(cur - addr)
        cur = int.from_bytes(buf[cur - addr : cur - addr + 8], "little")
    assert cur == addr and seen == {i * 64 for i in range((1 << 14) // 64)}


def test_the_write_pass_stores_every_byte_and_refuses_a_range_outside_the_buffer() -> None:
    buf = mmap.mmap(-1, 1 << 16)
    buf[:] = b"\xff" * len(buf)
    native._native.bench_write_nt(buf, 4096, 8192 + 100)
    assert buf[4096 : 4096 + 8292] == bytes(8292) and buf[4095] == 0xFF and buf[4096 + 8292] == 0xFF
    with pytest.raises(ValueError, match="outside"):
        native._native.bench_read(buf, 1 << 15, 1 << 16)
    with pytest.raises(ValueError, match="line-aligned"):
        native._native.bench_chase(buf, 8, 4096, 10)


def test_run_reports_dram_and_each_region_at_each_thread_count() -> None:
    buf = mmap.mmap(-1, 1 << 20)
    doc = pool_speed.run(buf, [Region("dev0", 0, 1 << 19), Region("dev1", 1 << 19, 1 << 19)], threads=[1, 2],
                         dram_bytes=1 << 19, emulated=True, repeat=1)  # fmt: skip
    assert doc["emulated"] is True
    assert [(r["region"], r["threads"]) for r in doc["rows"]] == [
        ("dram", 1), ("dev0", 1), ("dev1", 1), ("dram", 2), ("dev0", 2), ("dev1", 2),
    ]  # fmt: skip
    assert all(r["load_latency_ns"] > 0 and r["read_gb_per_s"] > 0 and r["write_nt_gb_per_s"] > 0 for r in doc["rows"])
    with pytest.raises(ValueError, match="too small"):
        pool_speed.measure(buf, Region("tiny", 0, 8192), 2)
