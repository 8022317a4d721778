"""The KV copy engine against real buffers: what lands in the pool is exactly each block's pieces."""

from __future__ import annotations

import mmap
import os

import pytest

from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address, plan_copies

NUM_BLOCKS = 6


def _kv_outer_layer(name: str, buf: mmap.mmap, *, piece: int) -> TensorView:
    """A GPU-style per-layer view [B, 2, piece] whose K/V dimension lies OUTSIDE the block:
    memory order is [2][B][piece], so block b's K and V are two pieces `NUM_BLOCKS * piece` apart."""
    return TensorView(
        name=name,
        address=buffer_address(buf),
        shape=(NUM_BLOCKS, 2, piece),
        strides=(piece, NUM_BLOCKS * piece, 1),
        itemsize=1,
        dtype="uint8",
    )


def _cpu_layer(name: str, buf: mmap.mmap, *, piece: int) -> TensorView:
    """A CPU-backend view [B, piece]: one contiguous piece per block."""
    return TensorView(name, buffer_address(buf), (NUM_BLOCKS, piece), (piece, 1), 1, "uint8")


@pytest.fixture
def layers():
    bufs = [mmap.mmap(-1, NUM_BLOCKS * 2 * 64) for _ in range(2)] + [mmap.mmap(-1, NUM_BLOCKS * 96)]
    for b in bufs:
        b[:] = os.urandom(len(b))
    views = [_kv_outer_layer("l0", bufs[0], piece=64), _kv_outer_layer("l1", bufs[1], piece=64)]
    views.append(_cpu_layer("l2", bufs[2], piece=96))
    yield bufs, KVBlockLayout.from_views(views)
    for b in bufs:
        b.close()


def _expected_block(bufs: list[mmap.mmap], block: int) -> bytes:
    k0 = bufs[0][block * 64 : block * 64 + 64]
    v0 = bufs[0][NUM_BLOCKS * 64 + block * 64 :][:64]
    k1 = bufs[1][block * 64 : block * 64 + 64]
    v1 = bufs[1][NUM_BLOCKS * 64 + block * 64 :][:64]
    return k0 + v0 + k1 + v1 + bufs[2][block * 96 : block * 96 + 96]


def test_layout_finds_outer_dimensions_as_separate_pieces(layers) -> None:
    _, layout = layers
    assert layout.pieces_per_block == 5
    assert layout.block_nbytes == 4 * 64 + 96
    assert [s.name for s in layout.segments] == ["l0[0]", "l0[1]", "l1[0]", "l1[1]", "l2"]


def test_save_then_load_round_trips_blocks_through_split_extents(layers) -> None:
    bufs, layout = layers
    pool = mmap.mmap(-1, 1 << 16)
    engine = KVCopyEngine(layout, pool)
    # block 4 split over two extents at an odd boundary, block 1 in one extent
    blocks = [(4, [(1000, 100), (5000, 252)]), (1, [(9000, 352)])]
    assert engine.save(blocks) == 2 * 352
    want4 = _expected_block(bufs, 4)
    assert pool[1000:1100] + pool[5000:5252] == want4
    assert pool[9000:9352] == _expected_block(bufs, 1)

    saved = {b: _expected_block(bufs, b) for b in (1, 4)}
    for b in bufs:
        b[:] = bytes(len(b))
    # load them back into other block slots
    assert engine.load([(0, [(1000, 100), (5000, 252)]), (5, [(9000, 352)])]) == 2 * 352
    assert _expected_block(bufs, 0) == saved[4]
    assert _expected_block(bufs, 5) == saved[1]
    assert _expected_block(bufs, 2) == bytes(352)  # nothing else touched


def test_neighbouring_blocks_coalesce_into_fewer_copies(layers) -> None:
    _, layout = layers
    n = layout.block_nbytes
    # blocks 2 and 3 to consecutive extents: the CPU-style layer's pieces are neighbours in both
    pieces = plan_copies(layout, [(2, [(0, n)]), (3, [(n, n)])])
    assert len(pieces) // 3 == 2 * layout.pieces_per_block  # different layers never coalesce...
    one_layer = KVBlockLayout.from_views([layout_view for layout_view in _single_cpu_views()])
    m = one_layer.block_nbytes
    merged = plan_copies(one_layer, [(b, [(b * m, m)]) for b in range(NUM_BLOCKS)])
    assert list(merged) == [0, 0, NUM_BLOCKS * m]  # ...but one layer's run of blocks is one copy


def _single_cpu_views():
    buf = mmap.mmap(-1, NUM_BLOCKS * 32)
    _single_cpu_views.keep = buf  # keep the mapping alive while the test uses its address
    yield _cpu_layer("only", buf, piece=32)


def test_bad_block_ids_and_short_or_outside_extents_are_refused(layers) -> None:
    _, layout = layers
    pool = mmap.mmap(-1, 4096)
    engine = KVCopyEngine(layout, pool)
    with pytest.raises(ValueError, match="outside 0..5"):
        engine.save([(NUM_BLOCKS, [(0, 352)])])
    with pytest.raises(ValueError, match="a block needs 352"):
        engine.save([(0, [(0, 351)])])
    with pytest.raises(ValueError, match="outside the pool"):
        engine.load([(0, [(4000, 352)])])


def test_non_contiguous_pieces_are_refused() -> None:
    buf = mmap.mmap(-1, 4096)
    padded = TensorView("pad", buffer_address(buf), (4, 8), (128, 8), 1, "uint8")  # 8 bytes used of every 8..
    with pytest.raises(ValueError, match="not contiguous"):
        KVBlockLayout.from_views([padded])


@pytest.fixture(params=[pytest.param("native", marks=pytest.mark.native), "python"])
def engine_impl(request, monkeypatch):
    """The engine over the native helper (the `native` marker: skipped without it, failed in CI), and
    over its pure-Python fallbacks."""
    from belugactl.dataplane import native

    if request.param == "python":
        monkeypatch.setattr(native, "_gather", native._py_gather)
        monkeypatch.setattr(native, "_gather_blocks", native._py_gather_blocks)
    return request.param


def test_whole_extent_batches_round_trip(layers, engine_impl) -> None:
    """The common case (each block in one extent) is planned by the helper, not plan_copies."""
    bufs, layout = layers
    n = layout.block_nbytes
    pool = mmap.mmap(-1, 1 << 16)
    engine = KVCopyEngine(layout, pool)
    saved = {b: _expected_block(bufs, b) for b in range(NUM_BLOCKS)}
    # blocks 0..2 back to back, block 5 elsewhere, block 3 in a larger-than-needed first extent
    batch = [(0, [(0, n)]), (1, [(n, n)]), (2, [(2 * n, n)]), (5, [(7000, n)]), (3, [(9000, n + 50), (20000, 10)])]
    assert engine.save(batch) == len(batch) * n
    for i, b in enumerate((0, 1, 2)):
        assert pool[i * n : (i + 1) * n] == saved[b]
    assert pool[7000 : 7000 + n] == saved[5]
    assert pool[9000 : 9000 + n] == saved[3]
    assert pool[9000 + n : 9000 + n + 50] == bytes(50)  # the extent's slack is not written

    for b in bufs:
        b[:] = bytes(len(b))
    assert engine.load([(4, [(0, n)]), (1, [(7000, n)])]) == 2 * n
    assert _expected_block(bufs, 4) == saved[0]
    assert _expected_block(bufs, 1) == saved[5]
    for b in (0, 2, 3, 5):
        assert _expected_block(bufs, b) == bytes(n)


def test_large_batches_go_non_temporal_and_stay_exact(engine_impl, monkeypatch) -> None:
    """A batch of NONTEMPORAL_FROM or more takes the streaming kernel, a smaller one does not; both
    exact with pieces of 48 KiB + 7 bytes (not a multiple of a line or of the kernel's 16 KiB step)
    at odd pool offsets. The threshold is lowered to 1 MiB to keep the buffers small."""
    from belugactl.dataplane import kvcopy, native

    monkeypatch.setattr(kvcopy, "NONTEMPORAL_FROM", 1 << 20)
    seen: list[bool] = []
    inner = native._gather_blocks

    def spy(pool, tensors, template, pairs, save, nontemporal):
        seen.append(nontemporal)
        return inner(pool, tensors, template, pairs, save, nontemporal)

    monkeypatch.setattr(native, "_gather_blocks", spy)

    piece, blocks = 48 * 1024 + 7, 12
    bufs = [mmap.mmap(-1, 2 * blocks * piece) for _ in range(2)]
    for b in bufs:
        b[:] = os.urandom(len(b))
    views = [
        TensorView(f"l{i}", buffer_address(b), (blocks, 2, piece), (piece, blocks * piece, 1), 1, "uint8")
        for i, b in enumerate(bufs)
    ]
    layout = KVBlockLayout.from_views(views)
    n = layout.block_nbytes
    assert blocks * n >= kvcopy.NONTEMPORAL_FROM
    pool = mmap.mmap(-1, blocks * n + 4096)
    engine = KVCopyEngine(layout, pool)
    batch = [(b, [(3 + (blocks - 1 - b) * n, n)]) for b in range(blocks)]  # reversed order in the pool
    assert engine.save(batch) == blocks * n
    expected = {}
    for b in range(blocks):
        expected[b] = b"".join(buf[k * blocks * piece + b * piece :][:piece] for buf in bufs for k in (0, 1))
        assert pool[3 + (blocks - 1 - b) * n :][:n] == expected[b]
    for buf in bufs:
        buf[:] = bytes(len(buf))
    assert engine.load(batch) == blocks * n
    for b in range(blocks):
        got = b"".join(buf[k * blocks * piece + b * piece :][:piece] for buf in bufs for k in (0, 1))
        assert got == expected[b]
    assert engine.save(batch[:1]) == n  # one block: under the threshold
    assert pool[3 + (blocks - 1) * n :][:n] == expected[0]
    assert seen == [True, True, False]
