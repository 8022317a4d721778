"""Flushes a test can see: the data plane's writes to the pool and reads from it, run on the counting
build of the native helper (belugactl/dataplane/native_counting.py), for each coherence mode.

Under `flush` (a write-back pool shared by hosts) every line written must be written back or streamed,
then fenced, and every line read must be invalidated first; under `none` (one host, a file or an
uncacheable pool) nothing is flushed at all. Deleting a flush in the C helper fails these tests.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native, native_counting
from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.native_counting import INV, WB, Counter
from belugactl.dataplane.rpc.protocol import HEADER_SIZE, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.header import EPOCH_OFFSET
from belugactl.pool.mapping import PoolMapping

pytestmark = pytest.mark.native
MODES = ["flush", "none"]
NS = 5_000_000_000


@pytest.fixture
def counter() -> Iterator[Counter]:
    if native_counting.load() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{native_counting.MISSING}; CI must build it", pytrace=False)
        pytest.skip(native_counting.MISSING)
    with native_counting.counting() as c:
        yield c


def _assert_mode(rec: native_counting.Recording, mode: str, written: list[tuple[int, int]],
                 read: list[tuple[int, int]]) -> None:  # fmt: skip
    if mode == "none":
        assert not rec.lines(WB) and not rec.lines(INV), rec.summary()
        return
    for off, n in written:
        assert rec.unpublished(off, n) == [], f"lines written but not made visible: {rec.records}"
    for off, n in read:
        assert rec.read_stale(off, n) == [], f"lines read without an invalidate: {rec.records}"


@pytest.mark.parametrize("mode", MODES)
def test_ring_slot_written_by_client_and_server_is_published_and_read_fresh(
    counter: Counter, pool_path: Path, mode: str
) -> None:
    pool = PoolMapping.open(pool_path)
    pool.needs_flush = mode == "flush"
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.start()
    try:
        t = CxlTransport(pool, 1)
        payload = os.urandom(t.max_payload - 7)  # a slot all but full: every line of it, the last one partly
        slot = pool.geometry.slot_offset(1, t._seq % t.slots_per_ring)
        counter.reset()
        t.submit(Op.PING, server.epoch, payload)
        # submit reads the slot's status word first (still busy from an abandoned request?): fresh
        _assert_mode(counter.recording(pool.buf), mode, [(slot, HEADER_SIZE + len(payload))], [(slot, 8)])
        counter.reset()
        assert server.poll_once(NS)
        # The server reads the request, then writes the reply (PING echoes the payload) in the same slot.
        _assert_mode(counter.recording(pool.buf), mode, [(slot, HEADER_SIZE + len(payload))],
                     [(slot, HEADER_SIZE + len(payload))])  # fmt: skip
        counter.reset()
        code, _epoch, rep = t.collect(NS)
        assert code == 0 and rep == payload
        _assert_mode(counter.recording(pool.buf), mode, [], [(slot, HEADER_SIZE + len(payload))])
    finally:
        server.close()
        pool.close()


BLOCKS, PIECE = 8, 4096 + 320  # a piece not a multiple of a line: heads and tails stored plainly


@pytest.fixture
def engine_parts() -> Iterator[tuple[mmap.mmap, KVBlockLayout, mmap.mmap]]:
    ten = mmap.mmap(-1, BLOCKS * PIECE)
    ten[:] = os.urandom(len(ten))
    layout = KVBlockLayout.from_views([TensorView("l0", buffer_address(ten), (BLOCKS, PIECE), (PIECE, 1), 1, "uint8")])
    pool = mmap.mmap(-1, 1 << 20)
    yield ten, layout, pool
    pool.close()
    ten.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_kv_blocks_saved_are_published_and_loaded_after_an_invalidate(
    counter: Counter, engine_parts, mode: str, split: bool
) -> None:
    ten, layout, pool = engine_parts
    engine = KVCopyEngine(layout, pool, coherence=mode)  # type: ignore[arg-type]
    # Odd pool offsets: the copy's unaligned head and tail lines are stored plainly and must be written back.
    blocks = [(2, [(1000, 100), (60_003, PIECE - 100)]) if split else (2, [(1000, PIECE)]), (5, [(200_017, PIECE)])]
    extents = [e for _, ex in blocks for e in ex]
    counter.reset()
    engine.save(blocks)
    _assert_mode(counter.recording(pool), mode, extents, [])
    counter.reset()
    ten[:] = bytes(len(ten))
    engine.load(blocks)
    assert ten[2 * PIECE : 3 * PIECE] != bytes(PIECE)
    _assert_mode(counter.recording(pool), mode, [], extents)


@pytest.mark.parametrize("mode", MODES)
def test_one_call_load_reads_lines_the_worker_invalidated(counter: Counter, engine_parts, mode: str) -> None:
    from array import array

    ten, layout, pool = engine_parts
    engine = KVCopyEngine(layout, pool, coherence=mode)  # type: ignore[arg-type]
    blocks = [(1, [(4096 + 24, PIECE)]), (6, [(300_000, PIECE)])]
    engine.save(blocks)
    pairs = engine.block_pairs(blocks)
    assert pairs is not None
    counter.reset()
    engine.flush_extents(blocks)  # what the vLLM worker does before its one-call load
    bad, _rel, _ns = native.load_blocks_checked(pool, engine.tensors, engine.template, pairs, array("q", [-1, -1]))
    assert bad == []
    _assert_mode(counter.recording(pool), mode, [], [e for _, ex in blocks for e in ex])


@pytest.mark.parametrize("mode", MODES)
def test_header_words_and_pool_writes_are_published(counter: Counter, pool_path: Path, mode: str) -> None:
    pool = PoolMapping.open(pool_path)
    pool.needs_flush = mode == "flush"
    try:
        off = pool.geometry.shared_kv_offset + 3
        counter.reset()
        pool.write(off, os.urandom(1000))
        before = pool.epoch()
        rec = counter.recording(pool.buf)
        _assert_mode(rec, mode, [(off, 1000)], [(EPOCH_OFFSET, 8)])
        counter.reset()
        assert pool.bump_epoch() == before + 1
        rec = counter.recording(pool.buf)
        # The epoch word is written back either way: every server start publishes it.
        assert rec.unpublished(EPOCH_OFFSET, 8) == []
        if mode == "flush":  # and the add starts from memory's word, not a stale cached line
            assert rec.read_stale(EPOCH_OFFSET, 8) == [], rec.records
    finally:
        pool.close()


def test_the_recording_sees_a_missing_flush(counter: Counter) -> None:
    """The checks themselves can fail: a plain copy with no write-back is caught, a flush after it is not."""
    buf = mmap.mmap(-1, 1 << 16)
    src = os.urandom(300)
    counter.reset()
    native.copy(buf, 100, src, 0, len(src))
    rec = counter.recording(buf)
    assert rec.unpublished(100, 300) == [(64, 448)]
    assert rec.read_stale(100, 300) == [(64, 448)]
    native.flush(buf, 100, 300)
    assert counter.recording(buf).unpublished(100, 300) == []
    assert counter.recording(buf).summary() == {
        "lines_written_back": 6, "lines_invalidated": 0, "nontemporal_bytes": 0, "fences": 1,
    }  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_journal_appends_are_published_and_replayed_after_an_invalidate(
    counter: Counter, pool_path: Path, mode: str
) -> None:
    from belugactl.dataplane.mds.journal import HEADER, Journal, encode_commit

    pool = PoolMapping.open(pool_path)
    pool.needs_flush = mode == "flush"
    try:
        g = pool.geometry
        j = Journal(pool, g.journal_offset, HEADER + 2 * 4096)
        counter.reset()
        j.rewrite([], {})
        start = j.pos
        j.append(encode_commit("n", b"k" * 16, 10, [(4096, g.shared_kv_offset)]))
        base = g.journal_offset + HEADER + j.half * j.half_size
        # The header (magic, generation word) and every record byte of the active half.
        _assert_mode(counter.recording(pool.buf), mode, [(g.journal_offset, 16), (base, j.pos)], [])
        assert j.pos > start
        counter.reset()
        assert len(list(Journal(pool, g.journal_offset, HEADER + 2 * 4096).read())) == 2
        _assert_mode(counter.recording(pool.buf), mode, [], [(g.journal_offset, 16), (base, j.pos)])
    finally:
        pool.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_doorbell_is_published_after_its_request_and_read_after_an_invalidate(
    counter: Counter, pool_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from belugactl.dataplane.mds import listener_cxl
    from belugactl.pool.geometry import DOORBELL_OFFSET

    monkeypatch.setattr(listener_cxl, "SWEEP_S", 1000.0)  # the doorbell, not the sweep, finds the request
    pool = PoolMapping.open(pool_path)
    pool.needs_flush = mode == "flush"
    # The listener in its doorbell mode: the fast path reads the doorbells only once it takes them.
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=False))
    server.start()
    try:
        assert server.ring._bells is not None
        g = pool.geometry
        t = CxlTransport(pool, 1)
        bell = g.doorbell_offset(1)
        server.poll_once(0)  # the server's first look (every ring once) before the recording
        counter.reset()
        t.submit(Op.PING, server.epoch, b"ding")
        assert pool.buf[bell] == 1
        _assert_mode(counter.recording(pool.buf), mode, [(bell, 1)], [])
        counter.reset()
        assert server.poll_once(0)  # found by its doorbell at the first look
        _assert_mode(counter.recording(pool.buf), mode, [], [(DOORBELL_OFFSET, g.doorbell_size)])
        assert t.collect(NS)[2] == b"ding"
        t.close()
    finally:
        server.close()
        pool.close()
