from __future__ import annotations

import random

import pytest

from belugactl.dataplane.mds.allocator import CHUNK, SIZE_CLASSES, Allocator

BASE = 4 * CHUNK


def test_small_request_gets_smallest_class_that_holds_it() -> None:
    a = Allocator(BASE, 8 * CHUNK)
    got = a.alloc(20_000)
    assert got is not None
    assert got.extents == [(BASE, 20_000)]
    assert got.footprint == min(c for c in SIZE_CLASSES if c >= 20_000)
    assert a.used == got.footprint and a.requested == 20_000


def test_blocks_of_one_class_do_not_overlap_and_come_back_after_free() -> None:
    a = Allocator(BASE, 4 * CHUNK)
    blocks = [a.alloc(16 << 10) for _ in range(100)]
    assert all(b is not None for b in blocks)
    offsets = sorted(b.extents[0][0] for b in blocks if b)
    assert all(y - x >= 16 << 10 for x, y in zip(offsets, offsets[1:], strict=False))
    for b in blocks:
        assert b is not None
        a.free(b)
    assert a.used == 0 and a.requested == 0


def test_large_request_takes_chunks_plus_a_tail_block_and_coalesces() -> None:
    a = Allocator(BASE, 16 * CHUNK)
    got = a.alloc(5 * CHUNK // 2)  # 2.5 chunks
    assert got is not None
    assert sum(n for _, n in got.extents) == 5 * CHUNK // 2
    # An empty area hands out chunks in address order, so the whole chunks form one extent.
    assert got.extents[0] == (BASE, 2 * CHUNK) or len(got.extents) == 1
    a.free(got)
    assert a.used == 0


def test_full_area_returns_none_and_takes_nothing() -> None:
    a = Allocator(BASE, 2 * CHUNK)
    first = a.alloc(2 * CHUNK)
    assert first is not None
    used = a.used
    assert a.alloc(4096) is None
    assert a.used == used
    a.free(first)
    assert a.alloc(3 * CHUNK) is None  # larger than the area
    assert a.used == 0


def test_request_just_under_a_chunk_takes_a_whole_chunk() -> None:
    a = Allocator(BASE, 2 * CHUNK)
    got = a.alloc(CHUNK - 1)
    assert got is not None and got.footprint == CHUNK
    a.free(got)
    assert a.stats()["free_chunks"] == 2


def test_unaligned_base_is_refused() -> None:
    with pytest.raises(ValueError):
        Allocator(BASE + 4096, CHUNK)


def test_churn_never_hands_out_overlapping_live_extents() -> None:
    rng = random.Random(7)
    a = Allocator(BASE, 32 * CHUNK)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.5:
            a.free(live.pop(rng.randrange(len(live))))
            continue
        got = a.alloc(rng.choice([4096, 20_000, 160 << 10, CHUNK + 12345, 700_000]))
        if got is not None:
            live.append(got)
        spans = sorted((o, o + n) for g in live for o, n in g.extents)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))
        assert all(s >= BASE and e <= BASE + 32 * CHUNK for s, e in spans)
    assert a.requested == sum(g.nbytes for g in live)


def test_a_rack_sized_area_needs_no_per_chunk_setup() -> None:
    a = Allocator(BASE, 8 << 40)  # 8 TiB: 4 Mi chunks, handed out lazily
    assert a.stats()["free_chunks"] == (8 << 40) // CHUNK
    first = a.alloc(3 * CHUNK)
    assert first is not None and first.extents == [(BASE, 3 * CHUNK)]
    a.free(first)
    again = a.alloc(CHUNK)
    assert again is not None and again.extents[0][0] in {BASE, BASE + CHUNK, BASE + 2 * CHUNK}
    assert a.stats()["free_chunks"] == (8 << 40) // CHUNK - 1


def test_restore_rebuilds_free_lists_around_live_blocks() -> None:
    a = Allocator(BASE, 8 * CHUNK)
    live = [(100, [(4096, BASE + CHUNK)]), (CHUNK, [(CHUNK, BASE + 4 * CHUNK)])]
    restored = a.restore(live)
    assert [r.extents for r in restored] == [[(BASE + CHUNK, 100)], [(BASE + 4 * CHUNK, CHUNK)]]
    offsets = set()
    while (got := a.alloc(4096)) is not None:
        offsets.add(got.extents[0][0])
    assert BASE + CHUNK not in offsets and all(not BASE + 4 * CHUNK <= o < BASE + 5 * CHUNK for o in offsets)
    with pytest.raises(ValueError):
        Allocator(BASE, 8 * CHUNK).restore([(1, [(4096, BASE + 100)])])  # misaligned
