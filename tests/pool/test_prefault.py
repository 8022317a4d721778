"""PoolMapping.prefault: the page tables of a file pool filled ahead of the reads.

What it saves is measured with the kernel's own count of this process's minor page faults: bytes
written through one mapping (as another instance's save would) and then read through another (as
this worker's pool hit would) fault once per 16 pages, unless the reader prefaulted them.
"""

from __future__ import annotations

import errno
import mmap
import resource
import threading
from pathlib import Path

import pytest

from belugactl.pool.mapping import PoolMapping

SPAN = 8 << 20  # 2048 pages of 4 KiB: at least 128 faults with the kernel's 16-page fault-around


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _read_pages(pool: PoolMapping, offset: int, length: int) -> int:
    """Touch every page of the range through `pool`; the checksum keeps the reads from being skipped."""
    total = 0
    for off in range(offset, offset + length, mmap.PAGESIZE):
        total += pool.buf[off]
    return total


def _write(pool_path: Path, offset: int, length: int) -> None:
    with PoolMapping.open(pool_path) as writer:  # a mapping of its own, as another process has
        writer.buf[offset : offset + length] = bytes([7]) * length


def _populate_or_skip(pool: PoolMapping, offset: int, length: int) -> int:
    try:
        return pool.prefault(offset, length)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip("this kernel has no MADV_POPULATE_READ (Linux 5.14)")
        raise


def test_prefaulted_pages_are_read_without_faults(pool_path: Path) -> None:
    with PoolMapping.open(pool_path) as reader:
        g = reader.geometry
        cold, warm = g.shared_kv_offset, g.shared_kv_offset + SPAN
        assert g.shared_kv_size >= 2 * SPAN
        _write(pool_path, cold, 2 * SPAN)

        before = _faults()
        assert _read_pages(reader, cold, SPAN) == 7 * (SPAN // mmap.PAGESIZE)
        cold_faults = _faults() - before

        assert _populate_or_skip(reader, warm, SPAN) == SPAN
        before = _faults()
        assert _read_pages(reader, warm, SPAN) == 7 * (SPAN // mmap.PAGESIZE)
        warm_faults = _faults() - before

    assert cold_faults >= SPAN // mmap.PAGESIZE // 16 // 2, cold_faults  # the cost being removed is real
    assert warm_faults <= cold_faults // 10, (warm_faults, cold_faults)


def test_prefault_covers_the_mapping_in_chunks_and_stops_when_asked(pool_path: Path) -> None:
    with PoolMapping.open(pool_path) as pool:
        assert _populate_or_skip(pool, 0, None) == pool.size  # type: ignore[arg-type]
        # An offset inside a page starts at that page; a length past the end stops at the end.
        assert pool.prefault(pool.size - 100, 1 << 30, chunk=1 << 20) == 100 + (pool.size - 100) % mmap.PAGESIZE
        stop = threading.Event()
        stop.set()
        assert pool.prefault(stop=stop) == 0
