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


# --- chunks of one interleave position, and the read-only kernels (issue 33 item 3) -------------


def test_strided_write_and_chase_touch_only_the_chunks_of_one_position() -> None:
    buf = mmap.mmap(-1, 1 << 16)
    buf[:] = b"\xff" * len(buf)
    # position 1 of a 2-way 128 B interleave over [4096, 4096 + 8192): bytes 128..255 of every 256
    native._native.bench_write_nt(buf, 4096 + 128, 8192, 128, 256)
    for off in range(4096, 4096 + 8192, 256):
        assert buf[off : off + 128] == b"\xff" * 128 and buf[off + 128 : off + 256] == bytes(128), off
    assert buf[4095] == 0xFF and buf[4096 + 8192 + 128] == 0xFF
    buf[:] = b"\xff" * len(buf)
    native._native.bench_chase(buf, 128, 4096, 100, 3, 128, 256)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    chunk_lines = {o + d for o in range(128, 128 + 4096, 256) for d in (0, 64)}
    for off in range(0, 1 << 16, 64):
        if off not in chunk_lines:
            assert buf[off : off + 64] == b"\xff" * 64, off  # another position's line: untouched
    seen, cur = set(), int.from_bytes(buf[128:136], "little")
    for _ in range(len(chunk_lines)):
        seen.add(cur - addr)
        cur = int.from_bytes(buf[cur - addr : cur - addr + 8], "little")
    assert seen == chunk_lines
    with pytest.raises(ValueError, match="multiple"):
        native._native.bench_read(buf, 0, 4096 + 64, False, 128, 256)


def test_the_read_only_kernels_run_on_a_read_only_view_and_write_nothing() -> None:
    buf = mmap.mmap(-1, 1 << 20)
    buf[:] = bytes(range(256)) * (len(buf) // 256)
    before = bytes(buf)
    view = memoryview(buf).toreadonly()
    assert native._native.bench_chase(view, 0, 1 << 19, 5000, 1, 0, 0, True) > 0
    assert native._native.bench_chase(view, 4096, 1 << 18, 100, 1, 4096, 8192, True) > 0
    assert native._native.bench_read(view, 0, 1 << 19, True) > 0
    with pytest.raises(ValueError, match="readonly=True"):
        native._native.bench_chase(view, 0, 1 << 19, 10)
    with pytest.raises(TypeError):
        native._native.bench_write_nt(view, 0, 4096)
    doc = pool_speed.run(view, [Region("dev0", 0, 1 << 19)], threads=[1], dram_bytes=1 << 19, emulated=False,
                         writable=False, repeat=1)  # fmt: skip
    assert all(r["write_nt_gb_per_s"] is None and r["read_gb_per_s"] > 0 for r in doc["rows"])
    assert doc["rows"][1]["vs_dram"]["write"] is None and doc["rows"][1]["vs_dram"]["read"] > 0
    view.release()
    assert bytes(buf) == before


def test_a_scratch_file_is_left_blank_and_its_header_area_untouched(tmp_path) -> None:
    path = tmp_path / "scratch.pool"
    with open(path, "wb") as f:
        f.truncate(16 << 20)
    doc = pool_speed.bench_pool(str(path), threads=[1, 2], size=4 << 20, repeat=1)
    assert doc["pool"]["kind"] == "file" and doc["pool"]["access"]["mode"] == "read-write"
    assert doc["pool"]["access"]["offset"] == 2 << 20  # the header area is never measured
    assert [(r["region"], r["threads"]) for r in doc["rows"]] == [("dram", 1), ("device 0", 1), ("dram", 2),
                                                                  ("device 0", 2)]  # fmt: skip
    assert doc["rows"][1]["write_nt_gb_per_s"] > 0 and doc["latency_method"] == pool_speed.LATENCY_CHASE
    # the chase's pointers are overwritten with zeros: setup still finds the file blank; with 3
    # threads the write pass leaves the range's last page alone, so this is the chase's own clean-up
    pool_speed.bench_pool(str(path), threads=[3], size=4 << 20, repeat=1)
    assert path.read_bytes() == bytes(16 << 20)


# --- what may be touched ------------------------------------------------------------------


def _header(kv: tuple[int, int], partitions_end: int, format_version: int = 1) -> object:
    from types import SimpleNamespace

    geo = SimpleNamespace(shared_kv_offset=kv[0], shared_kv_size=kv[1], journal_offset=4 << 20, journal_size=1 << 20)
    hosts = [SimpleNamespace(offset=kv[0] + kv[1], size=partitions_end - kv[0] - kv[1])]
    return SimpleNamespace(geometry=geo, hosts=hosts, format_version=format_version)


def test_a_served_pool_is_refused_unless_read_only_and_then_only_its_kv_area_is_read() -> None:
    from belugactl.errors import UsageError

    state = pool_speed.PoolState("/dev/dax0.0", "devdax", 1 << 30, True, _header((8 << 20, 256 << 20), 1 << 30))
    with pytest.raises(UsageError, match="in use") as err:
        pool_speed.decide_access(state, read_only=False)
    assert "--read-only" in err.value.fix
    access = pool_speed.decide_access(state, read_only=True)
    assert (access.writable, access.offset, access.length) == (False, 8 << 20, 256 << 20)


def test_a_pool_nobody_serves_is_written_only_on_its_unused_tail() -> None:
    from belugactl.errors import UsageError

    free = pool_speed.PoolState("p", "devdax", 1 << 30, False, _header((8 << 20, 256 << 20), (512 << 20) + 4096))
    access = pool_speed.decide_access(free, read_only=False)
    assert (access.writable, access.offset, access.length) == (True, 514 << 20, (1 << 30) - (514 << 20))
    full = pool_speed.PoolState("p", "devdax", 1 << 30, False, _header((8 << 20, 256 << 20), 1 << 30))
    with pytest.raises(UsageError, match="no unused space"):
        pool_speed.decide_access(full, read_only=False)
    # a capacity pool's free slots are not in its header: nothing past its areas is taken for scratch
    capacity = pool_speed.PoolState("p", "devdax", 1 << 30, False, _header((8 << 20, 256 << 20), 512 << 20, 2))
    with pytest.raises(UsageError, match="capacity"):
        pool_speed.decide_access(capacity, read_only=False)
    assert not pool_speed.decide_access(capacity, read_only=True).writable


def test_data_that_is_not_a_pool_is_only_read_and_a_blank_device_is_scratch_after_its_header_area() -> None:
    from belugactl.errors import UsageError

    occupied = pool_speed.PoolState("p", "devdax", 1 << 30, False, None, "no header, but 5 bytes are not zero")
    with pytest.raises(UsageError, match="holds data"):
        pool_speed.decide_access(occupied, read_only=False)
    assert not pool_speed.decide_access(occupied, read_only=True).writable
    blank = pool_speed.PoolState("p", "devdax", 1 << 30, False)
    access = pool_speed.decide_access(blank, read_only=False)
    assert (access.writable, access.offset, access.length) == (True, 2 << 20, (1 << 30) - (2 << 20))


def test_inspect_finds_a_pool_file_its_header_and_a_server_lock(tmp_path) -> None:
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.pool.lock import ServerLock
    from tests.support.paths import CPU_DEMO

    pool = tmp_path / "demo.pool"
    create_file_pool(pool, CPU_DEMO)
    state = pool_speed.inspect_pool(str(pool))
    assert state.kind == "file" and state.header is not None and not state.served
    lock = ServerLock.acquire(pool)
    try:
        assert pool_speed.inspect_pool(str(pool)).served
    finally:
        lock.release()
    other = tmp_path / "data.bin"
    other.write_bytes(b"\0" * 100 + b"precious" + bytes(8 << 20))
    assert "not zero" in pool_speed.inspect_pool(str(other)).occupied


# --- regions per memory device --------------------------------------------------------------


def test_hardware_interleave_gives_each_position_its_chunks_and_one_interleaved_range() -> None:
    access = pool_speed.Access(True, 2 << 20, 64 << 20, "scratch")
    regions, notes = pool_speed.plan_regions(access, pool_speed.Interleave("hardware", 2, 4096), 1 << 20)
    assert [(r.name, r.offset, r.chunk, r.stride, r.touched) for r in regions] == [
        ("position 0", 2 << 20, 4096, 8192, 1 << 20),
        ("position 1", (2 << 20) + 4096, 4096, 8192, (1 << 20) - 4096),
        ("interleaved", 2 << 20, 0, 0, 1 << 20),
    ]
    assert "2 ways of 4096 B" in notes[0]


def test_software_interleave_measures_each_device_at_the_same_offset_and_strides_over_them() -> None:
    il = pool_speed.Interleave("software", 2, 2 << 20, 512 << 20)
    access = pool_speed.Access(False, 8 << 20, 256 << 20, "kv")  # lies on device 0 only
    regions, notes = pool_speed.plan_regions(access, il, 16 << 20)
    assert [r.name for r in regions] == ["device 0"] and "only device(s) 0" in notes[0]
    access = pool_speed.Access(False, 8 << 20, 1000 << 20, "kv")  # both devices
    regions, _ = pool_speed.plan_regions(access, il, 16 << 20)
    assert [(r.name, r.offset, r.length) for r in regions[:2]] == [
        ("device 0", 8 << 20, 16 << 20), ("device 1", (512 + 8) << 20, 16 << 20)]  # fmt: skip
    inter = regions[2]
    assert (inter.name, inter.offset, inter.chunk, inter.stride, inter.touched) == (
        "interleaved", 8 << 20, 8 << 20, 512 << 20, 16 << 20)  # fmt: skip


# --- expectations -----------------------------------------------------------------------------


def _doc(latency: float, read: float, write: float | None, **pool: object) -> dict:
    rows = [{"region": "dram", "threads": 1, "load_latency_ns": 90.0, "read_gb_per_s": 30.0, "write_nt_gb_per_s": 20.0}]
    for name, slower in (("device 0", 0.0), ("device 1", 0.5)):
        rows.append({"region": name, "threads": 1, "load_latency_ns": latency + slower, "read_gb_per_s": read - slower,
                     "write_nt_gb_per_s": write})  # fmt: skip
    rows.append({"region": "interleaved", "threads": 1, "load_latency_ns": 1.0, "read_gb_per_s": 99.0,
                 "write_nt_gb_per_s": 99.0})  # fmt: skip
    return {"pool": {"kind": "devdax", "emulated": False, **pool}, "rows": rows}


def test_compare_judges_the_worst_device_against_the_manifest_within_the_margin() -> None:
    from belugactl.model.manifest_schema import PoolExpect

    expect = PoolExpect(load_latency_ns=750, read_gbps_per_device=22.5, write_gbps_per_device=20, margin_percent=10)
    got = {v.figure: v for v in pool_speed.compare(_doc(800, 21.0, 19.0), expect)}
    assert [got[f].status for f in ("load_latency_ns", "read_gbps_per_device", "write_gbps_per_device")] == ["ok"] * 3
    assert (got["load_latency_ns"].measured, got["load_latency_ns"].device) == (800.5, "device 1")
    assert (got["read_gbps_per_device"].measured, got["read_gbps_per_device"].device) == (20.5, "device 1")
    got = {v.figure: v for v in pool_speed.compare(_doc(830, 20.0, None), expect)}
    assert got["load_latency_ns"].status == "warn" and got["read_gbps_per_device"].status == "warn"
    assert got["write_gbps_per_device"].status == "skip" and "read only" in got["write_gbps_per_device"].reason


def test_compare_never_judges_an_emulated_device_a_file_or_a_figure_nobody_expects() -> None:
    from belugactl.model.manifest_schema import PoolExpect

    expect = PoolExpect(load_latency_ns=750)
    assert {v.status for v in pool_speed.compare(_doc(5000, 1.0, 1.0, emulated=True), expect)} == {"skip"}
    assert "emulated" in pool_speed.compare(_doc(5000, 1.0, 1.0, emulated=True), expect)[0].reason
    assert "not a CXL device" in pool_speed.compare(_doc(5000, 1.0, 1.0, kind="file"), expect)[0].reason
    verdicts = pool_speed.compare(_doc(5000, 1.0, 1.0), expect)
    assert [v.status for v in verdicts] == ["warn", "skip", "skip"]
    assert [v.status for v in pool_speed.compare(_doc(5000, 1.0, 1.0), None)] == ["skip"] * 3


def test_sysfs_names_the_region_its_positions_memdevs_and_where_the_dax_device_starts() -> None:
    from tests.support.paths import REPO

    fixtures = REPO / "tests" / "fixtures"
    lab = pool_speed.sysfs_interleave("/dev/dax0.0", str(fixtures / "lab-guest"))
    assert (lab.mode, lab.ways, lab.base, lab.memdevs, lab.source) == ("one device", 1, 2 << 20, ("mem0",),
                                                                       "sysfs region0")  # fmt: skip
    two = pool_speed.sysfs_interleave("/dev/dax0.0", str(fixtures / "beluga-intel"))
    assert (two.mode, two.ways, two.granularity, two.memdevs) == ("hardware", 2, 4096, ("mem0", "mem1"))
    assert pool_speed.sysfs_interleave("/dev/dax0.0", str(fixtures / "nocxl")) is None
    assert pool_speed.interleave_of(None, two) is two and pool_speed._memdev_of("position 1", two) == "mem1"
    # a dax device starting one chunk into its region: position 0's first chunk is one chunk later
    shifted = pool_speed.Interleave("hardware", 2, 4096, base=4096, source="sysfs region0")
    regions, notes = pool_speed.plan_regions(pool_speed.Access(True, 2 << 20, 64 << 20, "scratch"), shifted, 1 << 20)
    assert [r.offset for r in regions] == [(2 << 20) + 4096, (2 << 20) + 8192, (2 << 20) + 4096]
    assert "starts 4096 B into the region" in notes[0]
