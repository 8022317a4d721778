from __future__ import annotations

import random

import pytest

from belugactl.dataplane.mds import allocator as allocator_mod
from belugactl.dataplane.mds.allocator import CHUNK, MIN_BLOCK, SIZE_CLASSES, Allocator, PackedShapes

BASE = 4 * CHUNK

_native_restore = pytest.mark.skipif(allocator_mod._restore_chunks is None, reason="the native helper is not built")


@pytest.fixture(params=["list", "packed", "packed-python"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """How a restore is given its records: a list (the Python replay's), PackedShapes (the native
    replay's, whose whole chunks _native_alloc.c restores), or PackedShapes with the helper gone."""
    if request.param == "list":
        return list
    if request.param == "packed":
        if allocator_mod._restore_chunks is None:
            pytest.skip("the native helper is not built")
    else:
        monkeypatch.setattr(allocator_mod, "_restore_chunks", None)
    return PackedShapes.pack


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


@pytest.mark.parametrize(
    "live",
    [
        [(CHUNK, [(CHUNK, BASE)]), (CHUNK, [(CHUNK, BASE)])],  # a whole chunk twice, one-block records
        [(CHUNK, [(CHUNK, BASE)]), (3 * CHUNK, [(CHUNK, BASE + CHUNK), (CHUNK, BASE)])],  # then in a multi-block one
        [(3 * CHUNK, [(CHUNK, BASE + CHUNK), (CHUNK, BASE)]), (CHUNK, [(CHUNK, BASE)])],  # and the other way
        [(CHUNK, [(CHUNK, BASE)]), (100, [(4096, BASE + 4096)])],  # a small block inside a whole chunk
        [(100, [(4096, BASE + 4096)]), (CHUNK, [(CHUNK, BASE)])],  # and the other way
        [(100, [(4096, BASE)]), (100, [(4096, BASE)])],  # a small block twice
        [(CHUNK, [(CHUNK, BASE + 4096)])],  # a whole chunk off its chunk
        [(CHUNK, [(CHUNK, BASE + 8 * CHUNK)])],  # past the area
        [(100, [(4096, BASE)]), (100, [(5000, BASE + CHUNK)])],  # not a class
        [(1, [(0, BASE)])],  # a block of size 0 (packed as a list of its own: no triple has size 0)
        [(1, [(0, BASE + CHUNK)]), (1, [])],  # and before a record of no blocks
    ],
)
@pytest.mark.parametrize("ways", [1, 2])
def test_restore_refuses_a_block_held_twice_in_any_form_and_changes_nothing(live: list, ways: int, form) -> None:
    make = lambda: Allocator(BASE, 8 * CHUNK, ways=ways, granularity=CHUNK) if ways > 1 else Allocator(BASE, 8 * CHUNK)  # noqa: E731
    records = [(1, [(4096, BASE + 3 * CHUNK)]), *live]
    with pytest.raises(ValueError) as reference:
        make().restore(records)  # the Python loop, in journal order: its message names the first bad record
    a = make()
    before = (a.used, a.requested, list(a._zone_used), a.stats())
    with pytest.raises(ValueError) as got:
        a.restore(form(records))
    assert str(got.value) == str(reference.value)  # whichever form, the same record named
    assert (a.used, a.requested, list(a._zone_used), a.stats()) == before
    assert a.restore([(1, [(4096, BASE + 3 * CHUNK)])])  # and it is still empty, so a restore works


def test_restore_says_misaligned_before_duplicated() -> None:
    # A misaligned block in a 4 KiB page another block holds is misaligned first (as it always said).
    with pytest.raises(ValueError, match="not aligned"):
        Allocator(BASE, 8 * CHUNK).restore([(1, [(4096, BASE)]), (1, [(4096, BASE + 100)])])
    with pytest.raises(ValueError, match="duplicated"):
        Allocator(BASE, 8 * CHUNK).restore([(1, [(4096, BASE)]), (1, [(4096, BASE)])])


def test_restore_of_chunks_held_up_to_the_top_hands_out_the_next_and_a_gap_first(form) -> None:
    full = Allocator(BASE, 8 * CHUNK)
    full.restore(form([(CHUNK, [(CHUNK, BASE + i * CHUNK)]) for i in range(5)]))
    got = full.alloc(CHUNK)
    assert got is not None and got.extents == [(BASE + 5 * CHUNK, CHUNK)]
    gap = Allocator(BASE, 8 * CHUNK)
    gap.restore(form([(CHUNK, [(CHUNK, BASE + i * CHUNK)]) for i in (0, 2, 3, 4)]))
    got = gap.alloc(CHUNK)
    assert got is not None and got.extents == [(BASE + CHUNK, CHUNK)]
    assert gap.stats()["free_chunks"] == full.stats()["free_chunks"] + 1 == 3


def test_requested_bytes_add_up_past_64_bits_in_every_form(form) -> None:
    # nbytes is the journal's word: two of 2^63 add to 2^64, as Python's ints add them.
    a = Allocator(BASE, 8 * CHUNK)
    a.restore(form([(2**63, [(CHUNK, BASE)]), (2**63, [(CHUNK, BASE + CHUNK)]), (5, [(CHUNK, BASE + 2 * CHUNK)])]))
    assert a.requested == 2**64 + 5 and a.used == 3 * CHUNK


def test_packed_shapes_naming_a_block_list_they_do_not_have_are_refused(form) -> None:
    # Hostile packed bytes (size 0: "see multi") whose place is past `multi`: a ValueError, which the
    # journal's rebuild turns into "journal inconsistent; started empty", never an IndexError.
    bad = PackedShapes(PackedShapes.pack([(CHUNK, [(CHUNK, BASE)])]).one + bytes(16) + (7).to_bytes(8, "little"), [])
    with pytest.raises(ValueError, match="block list 7 of 0"):
        list(bad)
    with pytest.raises(ValueError, match="block list 7 of 0"):
        bad[1]
    with pytest.raises(IndexError):
        bad[2]
    a = Allocator(BASE, 8 * CHUNK)
    with pytest.raises(ValueError, match="block list 7 of 0"):
        a.restore(bad)
    assert a.used == 0 and a.restore(form([(CHUNK, [(CHUNK, BASE)])]))


def test_packed_shapes_read_back_as_the_records_they_pack() -> None:
    shapes = [
        (CHUNK, [(CHUNK, BASE)]),
        (3 * CHUNK, [(CHUNK, BASE + CHUNK), (CHUNK, BASE + 2 * CHUNK)]),
        (9, [(4096, 0)]),
    ]
    packed = PackedShapes.pack(shapes)
    assert len(packed) == 3 and list(packed) == shapes and [packed[i] for i in range(3)] == shapes
    with pytest.raises(ValueError, match="triples"):
        PackedShapes(bytes(23), [])


@_native_restore
def test_the_native_chunk_restore_refuses_bad_arguments_without_harm() -> None:
    run = allocator_mod._restore_chunks
    one = PackedShapes.pack([(CHUNK, [(CHUNK, BASE)])]).one
    zones = lambda n: __import__("array").array("q", [0]) * n  # noqa: E731

    class Plain:  # no slots for an Allocation's fields
        pass

    class Props:  # the fields, but not as slots
        nbytes = _a = _b = property(lambda self: 0)

    for cls in (Plain, Props):
        with pytest.raises((TypeError, AttributeError)):
            run(one, bytearray(8), cls, BASE, BASE, BASE + 8 * CHUNK, CHUNK, 1, 0, zones(1))
    for bad in (one[:23], one + b"x"):  # not whole triples
        with pytest.raises(ValueError):
            run(bad, bytearray(8), allocator_mod.Allocation, BASE, BASE, BASE + 8 * CHUNK, CHUNK, 1, 0, zones(1))
    with pytest.raises(ValueError):  # fewer zone counters than ways
        run(one, bytearray(8), allocator_mod.Allocation, BASE, BASE, BASE + 8 * CHUNK, CHUNK, 4, CHUNK, zones(2))
    # Offsets at the ends of 64 bits, and a state shorter than the area says: refused, nothing read past it.
    for off in (2**64 - CHUNK, BASE + 8 * CHUNK):
        far = PackedShapes.pack([(CHUNK, [(CHUNK, off)])]).one
        with pytest.raises(ValueError, match="outside the area"):
            run(far, bytearray(8), allocator_mod.Allocation, BASE, BASE, 2**64 - 1, CHUNK, 1, 0, zones(1))
    got, rest, used, requested = run(
        one, bytearray(8), allocator_mod.Allocation, BASE, BASE, BASE + 8 * CHUNK, CHUNK, 1, 0, zones(1)
    )
    assert got[0] == allocator_mod.Allocation.one(BASE, CHUNK, CHUNK) and rest == [] and used == requested == CHUNK


# --- chunks go back to the free pool (issue 11 item 3) -------------------------------------------


def test_chunks_carved_by_one_size_are_reusable_by_another_once_empty() -> None:
    # Today's failure: 64 KiB blocks carve every chunk; freed, those chunks stayed with the
    # 64 KiB class and a 256 KiB request found nothing.
    a = Allocator(BASE, 8 * CHUNK)
    small = []
    while (got := a.alloc(64 << 10)) is not None:
        small.append(got)
    assert len(small) == 8 * CHUNK // (64 << 10)
    for got in small:
        a.free(got)
    assert a.stats()["free_chunks"] == 8 and a.used == 0
    big = []
    while (got := a.alloc(256 << 10)) is not None:
        big.append(got)
    assert len(big) == 8 * CHUNK // (256 << 10)  # the whole area again
    whole = Allocator(BASE, 8 * CHUNK)
    for got in big:
        a.free(got)
    assert a.alloc(8 * CHUNK) is not None and whole.alloc(8 * CHUNK) is not None


def test_a_partly_used_chunk_stays_with_its_class_until_its_last_block_goes() -> None:
    a = Allocator(BASE, 2 * CHUNK)
    blocks = [a.alloc(512 << 10) for _ in range(4)]  # one chunk, four blocks
    assert all(b is not None for b in blocks)
    for b in blocks[:3]:
        a.free(b)  # type: ignore[arg-type]
    assert a.stats()["free_chunks"] == 1
    a.free(blocks[3])  # type: ignore[arg-type]
    assert a.stats()["free_chunks"] == 2 and a.stats()["chunks_returned"] == 1


def test_no_class_sits_alone_in_a_chunk() -> None:
    # A 1.5 MiB class block would keep its whole chunk while counting 1.5 MiB as used (the
    # "75 % used" pool that was full). Such requests take the whole chunk and say so.
    assert all(CHUNK // c >= 2 for c in SIZE_CLASSES)
    a = Allocator(BASE, 4 * CHUNK)
    for size in (3 << 19, 5 << 18):  # 1.5 MiB, 1.25 MiB
        got = a.alloc(size)
        assert got is not None and got.footprint == CHUNK
        a.free(got)


# --- software interleave (issue 12 item 6) --------------------------------------------------------


def test_interleave_places_consecutive_extents_round_robin_over_equal_zones() -> None:
    a = Allocator(BASE, 16 * CHUNK, ways=4)
    assert a.zone_size == 4 * CHUNK
    zones = []
    for _ in range(8):
        got = a.alloc(64 << 10)
        assert got is not None
        zones.append(a.zone_of(got.extents[0][0]))
    assert zones == [0, 1, 2, 3, 0, 1, 2, 3]
    assert a.zone_bytes() == [2 * (64 << 10)] * 4


def test_interleave_stripes_a_large_extent_at_the_granularity() -> None:
    a = Allocator(BASE, 16 * CHUNK, ways=4, granularity=2 * CHUNK)
    got = a.alloc(6 * CHUNK)
    assert got is not None
    per_zone = [0] * 4
    for off, n in got.extents:
        per_zone[a.zone_of(off)] += n
    assert per_zone == [2 * CHUNK, 2 * CHUNK, 2 * CHUNK, 0]
    nxt = a.alloc(4096)
    assert nxt is not None and a.zone_of(nxt.extents[0][0]) == 1  # the next allocation starts one zone on


def test_interleave_balances_blocks_that_span_two_zones() -> None:
    a = Allocator(BASE, 64 * CHUNK, ways=4)
    for _ in range(16):
        assert a.alloc(CHUNK + (512 << 10)) is not None  # a chunk and a tail in the next zone
    assert a.zone_bytes() == [4 * (CHUNK + (512 << 10))] * 4


def test_interleave_falls_back_to_another_zone_rather_than_fail() -> None:
    a = Allocator(BASE, 4 * CHUNK, ways=2)
    held = [a.alloc(CHUNK) for _ in range(4)]
    assert all(h is not None for h in held)
    assert a.alloc(4096) is None
    a.free(held[0])  # type: ignore[arg-type]  # only zone 0 has room now
    for _ in range(3):
        got = a.alloc(4096)
        assert got is not None and a.zone_of(got.extents[0][0]) == 0


def test_interleave_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        Allocator(BASE, 8 * CHUNK, ways=0)
    with pytest.raises(ValueError):
        Allocator(BASE, 8 * CHUNK, ways=2, granularity=CHUNK + 4096)
    a = Allocator(BASE, 8 * CHUNK)
    assert a.alloc(4096) is not None
    with pytest.raises(ValueError):
        a.set_interleave(2)


def test_restore_keeps_zones_and_upgrades_blocks_of_a_dropped_class(form) -> None:
    a = Allocator(BASE, 8 * CHUNK, ways=2)
    restored = a.restore(form([(3 << 19, [(3 << 19, BASE + 5 * CHUNK)]), (4096, [(4096, BASE)])]))
    assert restored[0].blocks == [(CHUNK, BASE + 5 * CHUNK)]
    assert a.zone_bytes() == [4096, CHUNK]


def _state(a: Allocator) -> tuple:
    """What decides every later allocation, as sets: each zone's bump pointer and free chunks, each
    class's partly free chunks with their free blocks, the counts."""
    zones = [(z.fresh, {c for c in z.free if c >> 21 in z.stacked}, set(z.stacked)) for z in a._zones]
    partial = {c: [{n: sorted(f) for n, f in zone.items()} for zone in a._partial[c]] for c in SIZE_CLASSES}
    return zones, partial, dict(a._carved), a.used, a.requested, a.zone_bytes(), a.free_chunk_count


@pytest.mark.parametrize("ways", [1, 3])
def test_a_restore_from_the_live_blocks_rebuilds_the_allocators_state(ways: int, form) -> None:
    # A history of mixed sizes with frees leaves holes, partly free chunks and chunks given back; a
    # fresh allocator restored from what is still held is the same allocator, and both hand out the
    # same blocks from then on. The area starts off the first granule with interleave (zones_start > base).
    rng = random.Random(ways)
    make = lambda: Allocator(BASE + CHUNK, 60 * CHUNK, ways=ways, granularity=2 * CHUNK)  # noqa: E731
    live, held = make(), []
    for _ in range(3000):
        if held and rng.random() < 0.45:
            live.free(held.pop(rng.randrange(len(held))))
        elif (
            got := live.alloc(rng.choice([4096, 20_000, 64 << 10, 700 << 10, 1_500_000, CHUNK, 3 * CHUNK + 8192]))
        ) is not None:
            held.append(got)
    assert held and any(len(h.blocks) > 1 for h in held) and live.chunks_returned
    again = make()
    restored = again.restore(form([(h.nbytes, h.blocks) for h in held]))
    assert [r.extents for r in restored] == [h.extents for h in held]
    assert [(r.nbytes, r.blocks) for r in restored] == [(h.nbytes, h.blocks) for h in held]
    assert _state(again) == _state(live)
    # The order within those sets is history's, so the two may pick different blocks; each takes
    # as many 4 KiB blocks as there is room for, none of them a block still held.
    held_blocks = {b for h in held for b in h.blocks}
    taken = []
    for a in (live, again):
        got = []
        while (x := a.alloc(4096)) is not None:
            got.extend(x.blocks)
        assert len(set(got)) == len(got) and not held_blocks & set(got)
        taken.append(len(got))
    assert taken[0] == taken[1] > 0


# --- what eviction would achieve ------------------------------------------------------------------


def test_planner_counts_a_chunk_only_when_all_its_blocks_go() -> None:
    a = Allocator(BASE, 2 * CHUNK)
    halves = [a.alloc(CHUNK // 2) for _ in range(4)]  # both chunks, two blocks each
    assert all(h is not None for h in halves)
    plan = a.fit_planner(CHUNK)
    assert not plan.fits()
    assert not plan.add(halves[0].blocks)  # type: ignore[union-attr]  # chunk 0 half free
    assert not plan.add(halves[2].blocks)  # type: ignore[union-attr]  # chunk 1 half free
    assert plan.add(halves[1].blocks)  # type: ignore[union-attr]  # chunk 0 empty
    tail = a.fit_planner(CHUNK // 2)
    assert tail.add(halves[0].blocks)  # type: ignore[union-attr]  # a free half is enough


def test_planner_does_not_count_a_freed_chunk_twice() -> None:
    # Freeing the only block of a chunk frees the chunk; it is not also a free slot for the tail.
    a = Allocator(BASE, 2 * CHUNK)
    lone = a.alloc(4096)
    filler = a.alloc(CHUNK)
    assert lone is not None and filler is not None
    plan = a.fit_planner(CHUNK + 4096)  # a chunk and a 4 KiB tail
    assert not plan.add(lone.blocks)
    assert plan.add(filler.blocks)


# --- properties -----------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_sizes = st.one_of(
    st.integers(1, 64 << 10), st.integers(64 << 10, CHUNK), st.integers(CHUNK, 3 * CHUNK), st.sampled_from(SIZE_CLASSES)
)
_ops = st.lists(st.tuples(st.booleans(), _sizes, st.integers(0, 1 << 30)), min_size=1, max_size=120)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, ways=st.integers(1, 4), gran=st.sampled_from([1, 2]))
def test_property_live_extents_never_overlap_and_accounting_adds_up(
    ops: list[tuple[bool, int, int]], ways: int, gran: int
) -> None:
    area = 12 * CHUNK
    a = Allocator(BASE, area, ways=ways, granularity=gran * CHUNK)
    live = []
    for do_free, size, pick in ops:
        if do_free and live:
            a.free(live.pop(pick % len(live)))
        else:
            got = a.alloc(size)
            if got is not None:
                assert sum(n for _, n in got.extents) == size
                live.append(got)
        spans = sorted((o, o + n) for g in live for o, n in g.extents)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))
        assert all(s >= BASE and e <= BASE + area for s, e in spans)
        blocks = sorted((off, off + size) for g in live for size, off in g.blocks)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(blocks, blocks[1:], strict=False))
        assert a.used == sum(g.footprint for g in live) == sum(a.zone_bytes())
        assert a.requested == sum(g.nbytes for g in live)
        stats = a.stats()
        carved = sum(v["chunks"] for v in stats["classes"].values())  # type: ignore[union-attr]
        whole = sum(1 for g in live for s, _ in g.blocks if s == CHUNK)
        assert carved + whole + a.free_chunk_count == a.chunks  # every chunk is in exactly one place


@settings(max_examples=40, deadline=None)
@given(ops=_ops, size=_sizes)
def test_property_after_freeing_everything_any_size_fills_the_area(ops: list[tuple[bool, int, int]], size: int) -> None:
    a = Allocator(BASE, 8 * CHUNK)
    live = [g for _, s, _ in ops if (g := a.alloc(s)) is not None]
    for g in live:
        a.free(g)
    assert a.free_chunk_count == 8 and a.used == 0
    whole, cls = Allocator.shape(size)
    per_alloc = whole * CHUNK + cls
    count = 0
    while a.alloc(size) is not None:
        count += 1
    if cls and not whole:
        assert count == 8 * (CHUNK // cls)  # every free chunk reusable by this size
    else:
        assert count * per_alloc > 8 * CHUNK - per_alloc - CHUNK


# --- software interleave: the placement, pinned (issue 12 item 6) ------------------------------


def _granule_zones(a: Allocator, got, granularity: int) -> list[set[int]]:
    """The zones each successive `granularity` bytes of an allocation's bytes (in extent order) lie in."""
    pieces: list[set[int]] = []
    pos = 0
    for off, n in got.extents:
        for at in range(off, off + n, MIN_BLOCK):
            index = (pos + at - off) // granularity
            while len(pieces) <= index:
                pieces.append(set())
            pieces[index].add(a.zone_of(at))
        pos += n
    return pieces


@pytest.mark.parametrize(("ways", "granularity"), [(2, CHUNK), (4, CHUNK), (4, 2 * CHUNK), (3, 4 * CHUNK)])
def test_consecutive_granules_of_one_block_rotate_over_the_zones(ways: int, granularity: int) -> None:
    a = Allocator(3 * CHUNK, 200 * CHUNK + 4096, ways=ways, granularity=granularity)
    start = 0
    for _ in range(2 * ways + 1):  # every starting zone, and around again
        nbytes = 2 * ways * granularity + 300 * 1024  # two turns of whole granules, then a tail
        got = a.alloc(nbytes)
        assert got is not None and sum(n for _, n in got.extents) == nbytes
        zones = _granule_zones(a, got, granularity)
        # Each granule lies in one zone; granule g in zone (start + g) mod ways; the tail goes on.
        assert zones == [{(start + g) % ways} for g in range(2 * ways + 1)]
        # Spread evenly: every zone holds exactly two granules of this block.
        per_zone = [0] * ways
        for off, n in got.extents:
            per_zone[a.zone_of(off)] += n
        tail_zone = (start + 2 * ways) % ways
        assert [b - (300 * 1024 if z == tail_zone else 0) for z, b in enumerate(per_zone)] == [2 * granularity] * ways
        start = (start + 1) % ways


@pytest.mark.parametrize(
    ("base", "size", "ways", "granularity"),
    [(3 * CHUNK, 19 * CHUNK + 777, 4, CHUNK), (3 * CHUNK, 50 * CHUNK, 4, 2 * CHUNK), (CHUNK, 97 * CHUNK, 3, 8 * CHUNK)],
)
def test_zones_are_equal_aligned_and_inside_the_area(base: int, size: int, ways: int, granularity: int) -> None:
    a = Allocator(base, size, ways=ways, granularity=granularity)
    ranges = a.zone_ranges()
    assert len(ranges) == ways and {n for _, n in ranges} == {a.zone_size}
    assert a.zone_size % granularity == 0 and a.zone_size > 0
    assert all(start % granularity == 0 for start, _ in ranges)  # pool offsets, not offsets in the area
    assert [s for s, _ in ranges] == [ranges[0][0] + z * a.zone_size for z in range(ways)]  # back to back
    assert base <= ranges[0][0] and ranges[-1][0] + a.zone_size <= base + size
    # What is left over is less than a granule in front and less than a granule per zone behind.
    front, back = ranges[0][0] - base, base + size - (ranges[-1][0] + a.zone_size)
    assert front < granularity and back < ways * granularity + CHUNK
    assert a.capacity == ways * a.zone_size and a.unused_bytes == size - a.capacity == front + back
    assert a.stats()["interleave"]["unused_bytes"] == a.unused_bytes
    # Every chunk the allocator can hand out is inside a zone, and all of them can be handed out.
    got = a.alloc(a.capacity)
    assert got is not None and a.alloc(4096) is None
    assert all(ranges[0][0] <= off and off + n <= ranges[-1][0] + a.zone_size for off, n in got.extents)
    assert a.zone_bytes() == [a.zone_size] * ways


def test_without_interleave_the_whole_area_is_one_zone_and_nothing_is_unused() -> None:
    a = Allocator(3 * CHUNK, 19 * CHUNK + 777)
    assert a.zone_ranges() == [(3 * CHUNK, 19 * CHUNK)] and a.unused_bytes == 777 and a.capacity == 19 * CHUNK
    small = Allocator(3 * CHUNK, 3 * CHUNK, ways=4, granularity=2 * CHUNK)  # not a granule per way
    assert small.ways == 1 and small.capacity == 3 * CHUNK


def test_a_block_of_many_granules_is_spread_evenly_and_survives_a_restart() -> None:
    a = Allocator(3 * CHUNK, 128 * CHUNK, ways=4, granularity=CHUNK)
    first = a.alloc(CHUNK // 2)  # carve one chunk of zone 0: the zones' fresh pointers now differ
    got = a.alloc(16 * CHUNK)
    assert first is not None and got is not None
    per_zone = [0] * 4
    for off, n in got.extents:
        per_zone[a.zone_of(off)] += n
    assert per_zone == [4 * CHUNK] * 4
    # A restart rebuilds the very same extents (the journal keeps the blocks in placement order).
    again = Allocator(3 * CHUNK, 128 * CHUNK, ways=4, granularity=CHUNK)
    restored = again.restore([(first.nbytes, first.blocks), (got.nbytes, got.blocks)])
    assert [r.extents for r in restored] == [first.extents, got.extents]
    assert again.zone_bytes() == a.zone_bytes()


# --- the compact one-block Allocation (issue 31 item 2) -------------------------------------------


def test_one_block_allocations_read_as_the_general_form_does() -> None:
    """A one-block Allocation (a class block, or one whole chunk) reads, compares and prints exactly as
    the general form built from the same extents and blocks; several blocks keep the general form."""
    from belugactl.dataplane.mds.allocator import Allocation

    a = Allocator(BASE, 8 * CHUNK)
    small, chunk, big = a.alloc(100), a.alloc(CHUNK), a.alloc(CHUNK + 100)
    assert small is not None and chunk is not None and big is not None
    off = small.blocks[0][1]
    assert small.extents == [(off, 100)] and small.blocks == [(4096, off)] and small.footprint == 4096
    assert small == Allocation([(off, 100)], [(4096, off)], 100) == Allocation.one(off, 4096, 100)
    assert repr(small) == f"Allocation(extents=[({off}, 100)], blocks=[(4096, {off})], nbytes=100)"
    coff = chunk.blocks[0][1]
    assert chunk.extents == [(coff, CHUNK)] and chunk.blocks == [(CHUNK, coff)] and chunk.footprint == CHUNK
    assert len(big.blocks) == 2 and big.footprint == CHUNK + 4096 and sum(n for _o, n in big.extents) == CHUNK + 100
    assert small != chunk and small != Allocation.one(off, 4096, 99) and small != Allocation.one(off, 8192, 100)
    with pytest.raises(TypeError):
        hash(small)  # compared by value, so not hashable (as the dataclass it replaced)
    # A restart gives back equal allocations in both forms, and the same accounting.
    again = Allocator(BASE, 8 * CHUNK)
    restored = again.restore([(x.nbytes, x.blocks) for x in (small, chunk, big)])
    assert restored == [small, chunk, big] and (again.used, again.requested) == (a.used, a.requested)
    for x in (small, chunk, big):
        a.free(x)
    assert a.used == 0


def test_a_one_block_allocation_costs_no_lists() -> None:
    """At millions of blocks the index's bytes a block are what this class costs (docs/measurements.md,
    2026-12-07): 10,000 one-block allocations stay under 128 B of Python objects each (the dataclass
    with its extents and blocks lists: 401 B)."""
    import gc
    import tracemalloc

    a = Allocator(BASE, 64 * CHUNK)
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [a.alloc(4096) for _ in range(10_000)]
        per = (tracemalloc.get_traced_memory()[0] - before) / len(held)
    finally:
        tracemalloc.stop()
        gc.enable()
    assert all(h is not None for h in held)
    assert per < 128, f"{per:.0f} B of Python objects a one-block allocation"


def test_single_names_the_one_block_and_nothing_for_several() -> None:
    a = Allocator(BASE, 8 * CHUNK)
    small, chunk, big = a.alloc(100), a.alloc(CHUNK), a.alloc(CHUNK + 100)
    assert small is not None and chunk is not None and big is not None
    assert small.single == small.blocks[0] and small.single[0] == 4096
    assert chunk.single == (CHUNK, chunk.blocks[0][1])
    assert big.single is None and len(big.blocks) == 2
