from __future__ import annotations

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import EVICT_STEP, IndexConfig, IndexError_, KVIndex


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(chunks: int = 8, **cfg) -> tuple[KVIndex, Clock, int]:
    clock = Clock()
    zeroed: list[tuple[int, int]] = []
    idx = KVIndex(
        Allocator(CHUNK, chunks * CHUNK), IndexConfig(**cfg), clock=clock, zero=lambda o, n: zeroed.append((o, n))
    )
    idx.zeroed = zeroed  # type: ignore[attr-defined]
    return idx, clock, idx.open_namespace("m/tp0")


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def put(idx: KVIndex, ns: int, i: int, n: int = CHUNK) -> None:
    token, _ = idx.reserve(ns, key(i), n)
    idx.commit(token)


def test_a_restore_rebuilds_what_the_commits_built_and_keeps_the_first_of_a_key_given_twice() -> None:
    """KVIndex.restore (a journal restart) leaves the index as the commits left it: every entry found in
    its namespace, the namespaces' live counts, each tenant's stored bytes and LRU, the allocator's use."""
    idx, _, ns = make(chunks=16)
    other = idx.open_namespace("m/tp1")
    for i in range(40):
        put(idx, ns if i % 3 else other, i, 4096 * (1 + i % 4))
    live = [(idx.ns_names[e.key[0]], e.key[1], e.alloc) for e in idx.entries.values()]
    again, _, _ = make(chunks=16)
    allocs = again.alloc.restore([(a.nbytes, a.blocks) for _n, _k, a in live])
    items = [(name, k, a) for (name, k, _a), a in zip(live, allocs, strict=True)]
    dup = ("m/tp0", key(1), items[0][2])  # a key given twice: the first stays
    again.restore([*items, dup], [7] * len(items) + [8])
    assert len(again.entries) == len(idx.entries) == 40
    for name, k, a in live:
        n = again.namespaces[name]
        found = again.get(n, k)
        assert found is not None and found[0].alloc.extents == a.extents and found[0].checksum == 7
    assert again.alloc.used == idx.alloc.used and again.alloc.requested == idx.alloc.requested
    for name in ("m/tp0", "m/tp1"):
        a_ns, b_ns = idx.namespaces[name], again.namespaces[name]
        assert again._ns_live[b_ns] == idx._ns_live[a_ns] and b_ns not in again._ns_empty
    assert again.tenant.stored_bytes == idx.tenant.stored_bytes and len(again.tenant.lru) == 40


def test_reserved_block_is_invisible_until_commit() -> None:
    idx, _, ns = make()
    token, alloc = idx.reserve(ns, key(1), 1000)
    assert alloc.extents and idx.get(ns, key(1)) is None
    assert idx.lookup_prefix(ns, [key(1)]) == (0, 0)
    idx.commit(token)
    found = idx.get(ns, key(1))
    assert found is not None and found[0].alloc.extents == alloc.extents


def test_prefix_lookup_counts_leading_blocks_only() -> None:
    idx, _, ns = make()
    for i in (0, 1, 2, 4):
        put(idx, ns, i, 4096)
    count, lease = idx.lookup_prefix(ns, [key(i) for i in range(6)])
    assert count == 3 and lease
    assert idx.lookup_prefix(ns, [key(3), key(0)]) == (0, 0)


def test_namespaces_are_separate() -> None:
    idx, _, ns = make()
    other = idx.open_namespace("m/tp1")
    put(idx, ns, 1, 4096)
    assert idx.get(other, key(1)) is None
    assert idx.clear_namespace(other) == 0
    assert idx.clear_namespace(ns) == 1 and idx.get(ns, key(1)) is None
    with pytest.raises(IndexError_) as err:
        idx.get(99, key(1))
    assert err.value.code == "UNKNOWN_NS"


def test_second_reserve_of_a_key_is_refused_while_pending_or_committed() -> None:
    idx, _, ns = make()
    token, _ = idx.reserve(ns, key(1), 4096)
    with pytest.raises(IndexError_) as err:
        idx.reserve(ns, key(1), 4096)
    assert err.value.code == "EXISTS"
    idx.commit(token)
    with pytest.raises(IndexError_):
        idx.reserve(ns, key(1), 4096)


def test_uncommitted_reservation_is_reclaimed_after_its_ttl_and_late_commit_fails() -> None:
    idx, clock, ns = make(reservation_ttl_s=5)
    token, _ = idx.reserve(ns, key(1), CHUNK)
    assert idx.alloc.used == CHUNK
    clock.t += 4
    idx.expire()
    assert idx.alloc.used == CHUNK
    clock.t += 2
    idx.expire()
    assert idx.alloc.used == 0 and idx.counters.reservations_reclaimed == 1
    with pytest.raises(IndexError_) as err:
        idx.commit(token)
    assert err.value.code == "NO_RESERVATION"
    assert idx.get(ns, key(1)) is None


def test_a_committed_or_aborted_reservation_leaves_the_deadline_queue_at_once() -> None:
    """Finished reservations do not wait in the deadline queue for their TTL (at 40 k saves/s that was
    a million tuples); one still pending keeps its place, and its TTL still reclaims it."""
    idx, clock, ns = make(chunks=64, reservation_ttl_s=30)
    for i in range(50):
        put(idx, ns, i, 4096)
    assert len(idx._pending_q) == 0
    stuck, _ = idx.reserve(ns, key(100), 4096)
    for i in range(50, 100):
        put(idx, ns, i, 4096)
    token, _ = idx.reserve(ns, key(101), 4096)
    idx.abort(token)
    assert [t for _d, t in idx._pending_q] != [] and idx._pending_q[0][1] == stuck
    assert len(idx._pending_q) <= 52  # the ones behind the stuck head wait for it to go
    idx.commit(stuck)
    assert len(idx._pending_q) == 0
    lost, _ = idx.reserve(ns, key(102), 4096)
    clock.t += 31
    idx.expire()
    assert idx.counters.reservations_reclaimed == 1 and len(idx._pending_q) == 0 and lost not in idx.pending


def test_abort_frees_at_once() -> None:
    idx, _, ns = make()
    token, _ = idx.reserve(ns, key(1), CHUNK)
    idx.abort(token)
    assert idx.alloc.used == 0 and idx.get(ns, key(1)) is None


def test_eviction_takes_coldest_unleased_blocks_and_skips_leased_and_pending() -> None:
    idx, _, ns = make(chunks=10, high_watermark=0.9, low_watermark=0.5)
    for i in range(8):
        put(idx, ns, i)
    pending, _ = idx.reserve(ns, key(100), CHUNK)  # uncommitted: never evicted
    _, lease = idx.lookup_prefix(ns, [key(0)])  # key 0 is the coldest, but leased (and now hot)
    idx.get(ns, key(1))  # key 1 touched too (lease granted)
    put(idx, ns, 8)  # 10 chunks used > 90 %: a sweep down to 50 % starts, the commit evicts nothing
    assert idx.sweeping and idx.background and idx.counters.evictions == 0
    while idx.background:
        idx.background_step()  # what the server does between its loop turns
    assert idx.alloc.used <= 5 * CHUNK and not idx.sweeping
    present = {i for i in range(9) if (ns, key(i)) in idx.entries}
    assert {0, 1} <= present  # leased blocks survive
    assert 8 in present  # the newest survives: LRU evicts from the cold end
    assert 2 not in present and idx.counters.evictions >= 4
    idx.commit(pending)  # the pending block was not touched by eviction
    assert idx.get(ns, key(100)) is not None
    assert lease


def test_the_watermark_sweep_evicts_in_bounded_steps_down_to_the_low_watermark() -> None:
    # Thousands of small blocks: the commit past the high watermark costs one commit; each step of the
    # sweep evicts at most EVICT_STEP blocks, coldest first, until usage is under the low watermark.
    idx, _, ns = make(chunks=8, high_watermark=0.9, low_watermark=0.5)
    block = 1024
    n = 0
    while not idx.sweeping:
        put(idx, ns, n, block)
        n += 1
    assert n > 5 * EVICT_STEP and idx.counters.evictions == 0
    assert idx.alloc.used > 0.9 * idx.alloc.capacity
    steps = []
    while idx.background:
        steps.append(idx.background_step())
    assert max(steps) == EVICT_STEP and len(steps) >= 3
    assert sum(steps) == idx.counters.evictions
    assert idx.alloc.used <= 0.5 * idx.alloc.capacity
    gone = [i for i in range(n) if (ns, key(i)) not in idx.entries]
    assert gone == list(range(len(gone)))  # the coldest went, in LRU order


def test_a_sweep_with_everything_leased_ends_and_a_later_commit_starts_another() -> None:
    idx, clock, ns = make(chunks=4, high_watermark=0.7, low_watermark=0.5, lease_ttl_s=5)
    for i in range(3):
        put(idx, ns, i)
    assert idx.sweeping
    assert idx.lookup_prefix(ns, [key(0), key(1), key(2)])[0] == 3  # all leased
    assert idx.background_step() == 0 and not idx.background  # nothing evictable: the sweep ends
    clock.t += 6
    idx.expire()
    put(idx, ns, 3)  # still above the high watermark: a new sweep
    assert idx.sweeping
    while idx.background:
        idx.background_step()
    assert idx.alloc.used <= 2 * CHUNK and (ns, key(3)) in idx.entries


def test_a_large_block_in_a_pool_of_small_ones_evicts_one_chunk_not_the_cache() -> None:
    # 64 chunks of 64 KiB blocks (32 a chunk), touched in a shuffled order so the LRU interleaves
    # every chunk: emptying one chunk in LRU order took most of the cache (issue 31: 293 k blocks,
    # a third of it, at 1.16 M). Now one chunk's blocks go, the chunk of the coldest block.
    import random

    idx, _, ns = make(chunks=64, high_watermark=1.0, low_watermark=0.99)
    small = 64 << 10
    n = 64 * CHUNK // small
    for i in range(n):
        put(idx, ns, i, small)
    order = list(range(n))
    random.Random(3).shuffle(order)
    for i in order:
        _e, lease = idx.get(ns, key(i))
        idx.release([lease])
    coldest = order[0]
    token, _ = idx.reserve(ns, key(10_000), CHUNK)  # needs a whole free chunk
    idx.commit(token)
    gone = [i for i in range(n) if (ns, key(i)) not in idx.entries]
    assert coldest in gone and len(gone) == CHUNK // small  # exactly one chunk's blocks
    assert len({i * small // CHUNK for i in gone}) == 1  # all from that one chunk
    assert idx.counters.evictions == len(gone)


def test_chunk_eviction_passes_over_a_chunk_with_a_leased_block() -> None:
    idx, _, ns = make(chunks=4, high_watermark=1.0, low_watermark=0.99)
    small = 64 << 10
    n = 4 * CHUNK // small
    for i in range(n):
        put(idx, ns, i, small)
    per = CHUNK // small
    # LRU: one block of each chunk first (coldest), the rest after; chunk 0 has a leased block.
    for c in range(4):
        for j in range(1, per):
            _e, lease = idx.get(ns, key(c * per + j))
            idx.release([lease])
    _e, held = idx.get(ns, key(5))  # chunk 0: leased, stays leased
    assert idx.lookup_prefix(ns, [key(per)])[0] == 1  # chunk 1's coldest leased too (now hot)
    token, _ = idx.reserve(ns, key(10_000), CHUNK)
    idx.commit(token)
    gone = {i // per for i in range(n) if (ns, key(i)) not in idx.entries}
    assert gone == {2}  # chunks 0 and 1 hold a leased block: the next cold chunk emptied
    assert idx.counters.evictions == per and held


def test_pool_full_when_everything_is_leased() -> None:
    idx, _, ns = make(chunks=2, high_watermark=1.0, low_watermark=0.5)
    put(idx, ns, 0)
    put(idx, ns, 1)
    assert idx.lookup_prefix(ns, [key(0), key(1)])[0] == 2
    with pytest.raises(IndexError_) as err:
        idx.reserve(ns, key(2), CHUNK)
    assert err.value.code == "POOL_FULL" and idx.counters.pool_full == 1


def test_reserve_evicts_to_make_room() -> None:
    idx, _, ns = make(chunks=2, high_watermark=1.0, low_watermark=0.99)
    put(idx, ns, 0)
    put(idx, ns, 1)
    token, _ = idx.reserve(ns, key(2), CHUNK)
    idx.commit(token)
    assert (ns, key(0)) not in idx.entries and (ns, key(2)) in idx.entries


def test_delete_while_leased_hides_at_once_and_frees_after_release() -> None:
    idx, _, ns = make(zero_on_free=True)
    put(idx, ns, 1, 8192)
    found = idx.get(ns, key(1))
    assert found is not None
    assert idx.delete(ns, key(1))
    assert idx.get(ns, key(1)) is None
    assert idx.alloc.used > 0 and idx.zeroed == []  # type: ignore[attr-defined]
    idx.release([found[1]])
    assert idx.alloc.used == 0
    assert idx.zeroed == found[0].alloc.extents  # type: ignore[attr-defined]
    assert not idx.delete(ns, key(1))


def test_leases_expire() -> None:
    idx, clock, ns = make(lease_ttl_s=3)
    put(idx, ns, 1, 4096)
    idx.lookup_prefix(ns, [key(1)])
    assert idx.entries[(ns, key(1))].leases == 1
    clock.t += 3.5
    idx.expire()
    assert idx.entries[(ns, key(1))].leases == 0 and not idx.leases
    assert idx.release([12345]) == 0


# --- allocator starvation and eviction (issue 11 item 3) ------------------------------------------


def test_another_block_size_fits_after_the_first_namespace_is_cleared() -> None:
    # Today's failure: 64 KiB blocks carved every chunk; after clearing their namespace a
    # 256 KiB block got POOL_FULL with the pool empty.
    idx, _, ns = make(chunks=10, high_watermark=1.0, low_watermark=0.99)
    i = 0
    while idx.alloc.free_chunk_count:
        put(idx, ns, i, 64 << 10)
        i += 1
    assert idx.clear_namespace(ns) == i
    while idx.background:  # the server's loop turns: the clear's steps
        idx.background_step()
    assert idx.alloc.used == 0
    other = idx.open_namespace("other/tp0")
    for j in range(30):  # 7.5 MiB of 20 MiB: no eviction is needed
        put(idx, other, j, 256 << 10)
    assert idx.counters.pool_full == 0 and idx.counters.evictions == 0


@pytest.mark.parametrize("size", [3 << 19, 5 << 18])  # 1.5 MiB, 1.25 MiB
def test_odd_block_sizes_evict_instead_of_pool_full_below_the_watermark(size: int) -> None:
    # Today's failure: the pool said POOL_FULL at 75 % "used" with zero evictions, because
    # eviction only ran above the byte watermark.
    idx, _, ns = make(chunks=10, high_watermark=0.9, low_watermark=0.8)
    for i in range(40):
        put(idx, ns, i, size)
    assert idx.counters.pool_full == 0 and idx.counters.evictions >= 30
    assert (ns, key(39)) in idx.entries


def test_a_starved_size_class_evicts_cold_blocks_of_another_class() -> None:
    idx, _, ns = make(chunks=4, high_watermark=1.0, low_watermark=0.99)
    for i in range(4 * 32):  # every chunk carved into 64 KiB blocks
        put(idx, ns, i, 64 << 10)
    token, _ = idx.reserve(ns, key(1000), 256 << 10)
    idx.commit(token)
    # The coldest 64 KiB blocks were evicted (the first chunk's 32), no more.
    assert idx.counters.evictions == 32
    assert (ns, key(0)) not in idx.entries and (ns, key(32)) in idx.entries


def test_a_reservation_that_cannot_fit_evicts_nothing() -> None:
    # Today's failure: one RESERVE evicted every unleased block and still failed. Here every
    # chunk keeps one leased block, so no chunk can empty and a 2-chunk block cannot fit.
    idx, _, ns = make(chunks=8, high_watermark=1.0, low_watermark=0.99)
    for i in range(8 * 32):
        put(idx, ns, i, 64 << 10)
    for c in range(8):
        assert idx.get(ns, key(c * 32)) is not None  # leased
    before = len(idx.entries)
    with pytest.raises(IndexError_) as err:
        idx.reserve(ns, key(9999), 2 * CHUNK)
    assert err.value.code == "POOL_FULL"
    assert len(idx.entries) == before and idx.counters.evictions == 0 and idx.counters.evictions_refused == 1
    with pytest.raises(IndexError_):
        idx.reserve(ns, key(9998), 9 * CHUNK)  # larger than the area: refused before any planning
    assert len(idx.entries) == before


def test_pending_reservations_are_never_evicted_to_make_room() -> None:
    idx, _, ns = make(chunks=2, high_watermark=1.0, low_watermark=0.99)
    t0, _ = idx.reserve(ns, key(0), CHUNK)
    put(idx, ns, 1, CHUNK)
    token, _ = idx.reserve(ns, key(2), CHUNK)  # evicts key 1, never the reservation
    assert (ns, key(1)) not in idx.entries
    idx.commit(t0)
    idx.commit(token)
    with pytest.raises(IndexError_):
        idx.reserve(ns, key(3), 3 * CHUNK)


# --- namespaces are bounded (issue 11 item 4) -----------------------------------------------------


def test_namespaces_are_capped_with_a_clear_refusal() -> None:
    # Today's failure: 100k namespaces in 1.5 s, never freed.
    idx, _, ns = make(max_namespaces=3)
    put(idx, ns, 1, 4096)
    a = idx.open_namespace("a")
    b = idx.open_namespace("b")
    put(idx, a, 1, 4096)
    put(idx, b, 1, 4096)
    with pytest.raises(IndexError_) as err:
        idx.open_namespace("c")
    assert err.value.code == "NS_LIMIT" and idx.counters.namespaces_refused == 1
    assert idx.open_namespace("a") == a  # an open one still answers
    assert len(idx.namespaces) == 3


def test_idle_empty_namespaces_are_dropped_at_the_cap_and_ids_are_not_reused() -> None:
    idx, clock, ns = make(max_namespaces=3, namespace_idle_s=60)
    put(idx, ns, 1, 4096)  # holds a block: never dropped
    a = idx.open_namespace("a")
    b = idx.open_namespace("b")
    token, _ = idx.reserve(b, key(1), 4096)  # a reservation keeps b
    clock.t += 30
    with pytest.raises(IndexError_):
        idx.open_namespace("c")  # a is empty but not idle long enough
    clock.t += 31
    c = idx.open_namespace("c")
    assert c not in (ns, a, b) and "a" not in idx.namespaces and idx.counters.namespaces_dropped == 1
    with pytest.raises(IndexError_) as err:
        idx.get(a, key(1))
    assert err.value.code == "UNKNOWN_NS"  # a stale id never lands in another namespace
    idx.commit(token)
    assert idx.get(b, key(1)) is not None


def test_a_namespace_emptied_by_eviction_or_clear_becomes_droppable() -> None:
    idx, clock, ns = make(max_namespaces=2, namespace_idle_s=10)
    put(idx, ns, 1, 4096)
    other = idx.open_namespace("other")
    put(idx, other, 1, 4096)
    idx.clear_namespace(ns)
    clock.t += 11
    fresh = idx.open_namespace("fresh")
    assert fresh > other and "m/tp0" not in idx.namespaces and "other" in idx.namespaces
    # Reopening a name refreshes its idle time.
    clock.t += 11
    idx.open_namespace("fresh")
    idx.clear_namespace(other)
    with pytest.raises(IndexError_):
        idx.open_namespace("third")  # other emptied just now; fresh was just used
    clock.t += 11
    assert idx.open_namespace("third") > fresh


# --- properties -----------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "reserve", "get", "release", "delete", "clear", "expire"]),
                  st.integers(0, 40), st.sampled_from([4096, 64 << 10, 700_000, 3 << 19, CHUNK + 5000, 5 * CHUNK])),
        min_size=1, max_size=150,
    )
)  # fmt: skip
def test_property_index_and_allocator_agree(ops: list[tuple[str, int, int]]) -> None:
    idx, clock, ns = make(chunks=8, lease_ttl_s=5, reservation_ttl_s=7, high_watermark=1.0, low_watermark=0.99)
    leases: list[int] = []
    for op, k, size in ops:
        evictions = idx.counters.evictions
        try:
            if op == "put":
                put(idx, ns, k, size)
            elif op == "reserve":
                idx.reserve(ns, key(k), size)  # left pending: reclaimed by expire after its TTL
            elif op == "get":
                found = idx.get(ns, key(k))
                if found:
                    leases.append(found[1])
            elif op == "release" and leases:
                idx.release([leases.pop(k % len(leases))])
            elif op == "delete":
                idx.delete(ns, key(k))
            elif op == "clear":
                idx.clear_namespace(ns)
            else:
                clock.t += 3
                idx.expire()
        except IndexError_ as exc:
            assert exc.code in ("POOL_FULL", "EXISTS")
            assert idx.counters.evictions == evictions  # a refused reserve evicted nothing
        live = list(idx.entries.values()) + [e for e in idx.by_id.values() if e.dead]
        allocs = [e.alloc for e in live] + [p.alloc for p in idx.pending.values()]
        spans = sorted((o, o + n) for a in allocs for o, n in a.extents)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))
        assert idx.alloc.used == sum(a.footprint for a in allocs)
        assert all(e.leases >= 0 for e in live)
        held = len(idx.entries) + len(idx.pending)  # one namespace: it holds every entry and reservation
        assert idx._ns_live[ns] == held and (ns in idx._ns_empty) == (held == 0)


def test_the_namespace_cap_reaches_the_client_as_ns_limit() -> None:
    from belugactl.dataplane.mds.service import MetadataService
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.dataplane.rpc.protocol import Code, Op

    idx, _, _ = make(max_namespaces=1)
    service = MetadataService(idx, epoch=1)
    code, _ = service.handle(int(Op.OPEN_NS), 1, p.encode_name("other"), 256)
    assert code == Code.NS_LIMIT and service.errors == {"NS_LIMIT": 1}


def test_the_software_interleave_of_the_manifest_reaches_the_index() -> None:
    from pathlib import Path

    from belugactl.cli.metadata_server_cmd import _interleave
    from belugactl.model.manifest import load_manifest

    rack = load_manifest(Path(__file__).parents[2] / "examples" / "beluga-rack.yaml")
    fields = _interleave(rack)
    assert fields == {"interleave_ways": rack.pool.interleave.ways, "interleave_granularity": CHUNK}
    idx = KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig(**fields))
    assert idx.alloc.ways == rack.pool.interleave.ways
    ns = idx.open_namespace("m")
    zones = {idx.alloc.zone_of(idx.reserve(ns, key(i), 4096)[1].extents[0][0]) for i in range(4)}
    assert zones == {0, 1, 2, 3}


def test_the_manifest_bounds_max_namespaces() -> None:
    from pydantic import ValidationError

    from belugactl.model.manifest_schema import MetadataServe

    assert MetadataServe().max_namespaces == 4096
    assert MetadataServe(max_namespaces=1).max_namespaces == 1
    for bad in (0, -5, (1 << 20) + 1):
        with pytest.raises(ValidationError, match="max_namespaces"):
            MetadataServe(max_namespaces=bad)


def test_saved_and_leased_bytes_count_what_moves() -> None:
    """The dashboard's 'bytes saved and loaded' come from these counters: committed bytes, and the
    bytes of every block a lease covers (a reader loads them), hits and misses beside them."""
    idx, _, ns = make()
    put(idx, ns, 1, 3000)
    put(idx, ns, 2, 5000)
    token, _ = idx.reserve(ns, key(3), 7000)
    idx.abort(token)  # aborted: never saved
    assert idx.counters.saved_bytes == 8000
    assert idx.lookup_prefix(ns, [key(1), key(2), key(9)])[0] == 2
    assert idx.get(ns, key(2)) is not None
    assert idx.get(ns, key(9)) is None
    assert idx.counters.leased_bytes == 3000 + 5000 + 5000
    assert (idx.counters.hits, idx.counters.misses) == (2, 1)
    assert idx.stats()["saved_bytes"] == 8000 and idx.stats()["leased_bytes"] == 13000


def test_the_manifest_bounds_spin_after_ms() -> None:
    from pydantic import ValidationError

    from belugactl.model.manifest_schema import MetadataServe

    assert MetadataServe().spin_after_ms == 50
    assert MetadataServe(spin_after_ms=0).spin_after_ms == 0
    for bad in (-1, 60_001):
        with pytest.raises(ValidationError, match="spin_after_ms"):
            MetadataServe(spin_after_ms=bad)


@pytest.fixture(params=["native", "python"])
def entry_maker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which makes a restore's entries: _native_restore.c's make_entries, or the Python comprehension."""
    from belugactl.dataplane.mds import index as index_mod

    if request.param == "python":
        monkeypatch.setattr(index_mod, "_make_entries", None)
    elif index_mod._make_entries is None:
        pytest.skip("the native helper is not built")
    return request.param


@pytest.mark.native
def test_a_column_restore_rebuilds_every_structure_in_journal_order_for_each_tenant(entry_maker: str) -> None:
    """restore_columns (a restart's one-call-per-map restore) against the index that commits built: two
    tenants (each its own LRU, in journal order), entries over several chunks with a small block
    (placed by offset), the slab, entry ids, and the mirror's puts in journal order."""
    from belugactl.dataplane.mds.quotas import TenantSpec

    def tenants(idx: KVIndex) -> KVIndex:
        idx.set_tenants((TenantSpec("a"), TenantSpec("b")), {1: "a", 2: "b"})
        return idx

    idx = tenants(KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig(), clock=Clock()))
    for i in range(60):
        idx.begin_request(1 + i % 2)
        ns = idx.open_namespace(f"m/tp{i % 3}")
        size = 2 * CHUNK + 4096 if i % 7 == 0 else 4096 * (1 + i % 5)
        token, _ = idx.reserve(ns, key(i), size)
        idx.commit(token, checksum=i)
    order = [e for e in idx.slab if e is not None]  # commit order: nothing was freed
    names = list(dict.fromkeys(idx.ns_names[e.key[0]] for e in order))
    again = tenants(KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig(), clock=Clock()))
    n = native._native
    mirror = n.fi_new()
    again.attach_mirror(mirror, n.fi_put, n.fi_del, lambda e: e.checksum.to_bytes(8, "little"))
    allocs = again.alloc.restore([(e.alloc.nbytes, e.alloc.blocks) for e in order])
    again.restore_columns(
        names, [names.index(idx.ns_names[e.key[0]]) for e in order], [e.key[1] for e in order], allocs,
        [e.checksum for e in order],
    )  # fmt: skip
    got = [e for e in again.slab if e is not None]
    assert [(again.ns_names[e.key[0]], e.key[1], e.alloc.blocks, e.checksum) for e in got] == [
        (idx.ns_names[e.key[0]], e.key[1], e.alloc.blocks, e.checksum) for e in order
    ]
    assert all(again.slab[e.slot] is e and again.by_id[e.id] is e for e in got)
    assert len({e.id for e in got}) == 60
    assert all(n.fi_id(mirror, e.key[0], e.key[1]) == e.id for e in got)  # the native mirror has each
    assert {off: e.key[1] for off, e in again._at.items()} == {off: e.key[1] for off, e in idx._at.items()}
    for t in ("a", "b"):
        before, after = idx.tenants.by_name[t], again.tenants.by_name[t]
        mine = [e.key[1] for e in order if idx._ns_tenant[e.key[0]] is before]
        assert [e.key[1] for e in after.lru.values()] == mine and len(mine) == 30
        assert after.stored_bytes == before.stored_bytes and after.namespaces == before.namespaces
    for name in names:
        assert again._ns_live[again.namespaces[name]] == idx._ns_live[idx.namespaces[name]]
        assert len(again._ns_keys[again.namespaces[name]]) == len(idx._ns_keys[idx.namespaces[name]])
    assert again.alloc.used == idx.alloc.used



@pytest.mark.parametrize("twice", [False, True])
def test_a_column_restore_of_one_namespace_takes_its_columns_as_they_are(twice: bool, entry_maker: str) -> None:
    """One namespace (a restart of one model's cache), whole chunks mixed with small blocks and
    entries of several chunks: restore_columns takes the key and allocation columns as they are
    (no key given twice) or entry by entry (a key twice), and rebuilds what the commits built."""
    idx = KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig(), clock=Clock())
    ns = idx.open_namespace("m/tp0")
    for i in range(40):
        size = [CHUNK, 4096, 3 * CHUNK + 65536, CHUNK, 65536][i % 5]
        token, _ = idx.reserve(ns, key(i), size)
        idx.commit(token, checksum=i)
    order = [e for e in idx.slab if e is not None]
    again = KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig(), clock=Clock())
    allocs = again.alloc.restore([(e.alloc.nbytes, e.alloc.blocks) for e in order])
    keys, sums = [e.key[1] for e in order], [e.checksum for e in order]
    if twice:  # the first key again at the end, at a block of its own: the first one stays
        allocs.append(again.alloc.take(4096, [(4096, 60 * CHUNK)]))
        keys.append(keys[0])
        sums.append(99)
    again.restore_columns(["m/tp0"], [0] * len(keys), keys, allocs, sums)
    got = [e for e in again.slab if e is not None]
    shape = lambda es: [(e.key[1], e.alloc.blocks, e.checksum) for e in es]  # noqa: E731
    assert shape(got) == shape(order)
    assert all(again.slab[e.slot] is e and again.by_id[e.id] is e for e in got)
    assert {off: e.key[1] for off, e in again._at.items()} == {off: e.key[1] for off, e in idx._at.items()}
    ans = again.namespaces["m/tp0"]
    held = lambda m: {k: e.alloc.blocks for k, e in m.items()}  # noqa: E731
    assert held(again._ns_keys[ans]) == held(idx._ns_keys[ns])
    assert [e.key[1] for e in again.tenants.default.lru.values()] == keys[:40]
    assert again.tenants.default.stored_bytes == idx.tenants.default.stored_bytes
    assert again._ns_live[ans] == 40 and len(again.entries) == 40

@pytest.mark.native
def test_native_entries_are_the_entries_python_makes_and_bad_columns_make_none() -> None:
    from array import array

    from belugactl.dataplane.mds import index as index_mod
    from belugactl.dataplane.mds.allocator import Allocation
    from belugactl.dataplane.mds.index import Entry

    make_entries = index_mod._make_entries
    if make_entries is None:
        pytest.skip("the native helper is not built")
    allocs = [Allocation.one(i * CHUNK, CHUNK, CHUNK - i) for i in range(50)]
    keys, ns_of, ns_ids, sums = [key(i) for i in range(50)], array("I", [i % 3 for i in range(50)]), [7, 9, 11], None
    for sums in (None, [i * 3 if i % 4 else None for i in range(50)]):
        got = make_entries(Entry, ns_ids, ns_of, keys, allocs, sums, 1000, 20)
        want = [
            Entry((ns_ids[ns_of[i]], keys[i]), allocs[i], 0, False, 1000 + i, sums[i] if sums else None, 20 + i)
            for i in range(50)
        ]
        assert got == want and all(g.gen is None and g.alloc is a for g, a in zip(got, allocs, strict=True))
    args = (Entry, ns_ids, ns_of, keys, allocs, None, 0, 0)
    bad = [
        ((Entry, ns_ids, ns_of[:-1], *args[3:]), ValueError),  # a column short
        ((Entry, ns_ids, ns_of, keys, allocs[:-1], None, 0, 0), ValueError),
        ((Entry, ns_ids, ns_of, keys, allocs, [1] * 49, 0, 0), ValueError),
        ((Entry, ns_ids[:2], ns_of, keys, allocs, None, 0, 0), ValueError),  # a namespace past ns_ids
        ((Entry, ns_ids, ns_of, [*keys[:-1], "text"], allocs, None, 0, 0), ValueError),  # a key that is no bytes
        ((Entry, ns_ids, ns_of, keys, allocs, None, -1, 0), ValueError),
        ((Entry, ns_ids, ns_of, keys, allocs, None, 2**63 - 10, 0), ValueError),  # ids past 64 bits
        ((Entry, ns_ids, ns_of, keys, allocs, (1,) * 50, 0, 0), TypeError),
        ((Allocation, ns_ids, ns_of, keys, allocs, None, 0, 0), AttributeError),  # not an entry's slots
    ]
    for call, error in bad:
        with pytest.raises(error):
            make_entries(*call)


@pytest.mark.native
@pytest.mark.parametrize("change", ["shrink", "swap"])
def test_native_entries_refuse_columns_that_change_while_they_are_made(change: str) -> None:
    # The cyclic GC can run inside any allocation, and with it Python code (here a gc callback) that
    # changes the columns: the maker must notice, refuse, and never read a freed or foreign item.
    import gc
    from array import array

    from belugactl.dataplane.mds import index as index_mod
    from belugactl.dataplane.mds.allocator import Allocation
    from belugactl.dataplane.mds.index import Entry

    if index_mod._make_entries is None:
        pytest.skip("the native helper is not built")
    n = 3000  # past the small-tuple free list, so the maker's allocations reach the GC
    keys, allocs = [key(i) for i in range(n)], [Allocation.one(CHUNK, CHUNK, CHUNK)] * n
    fired: list[int] = []

    def meddle(phase: str, _info: dict) -> None:
        if phase != "start":
            return
        fired.append(1)
        if len(fired) == 5:  # some entries in: the maker is under way
            if change == "shrink":
                del keys[n // 2 :]
            else:
                keys[-1] = "not bytes"

    threshold = gc.get_threshold()
    gc.callbacks.append(meddle)
    gc.set_threshold(50)
    try:
        with pytest.raises(ValueError):
            index_mod._make_entries(Entry, [0], array("I", bytes(4 * n)), keys, allocs, None, 0, 0)
    finally:
        gc.callbacks.remove(meddle)
        gc.set_threshold(*threshold)
    assert len(fired) >= 5


def test_a_restore_into_an_index_with_free_slab_places_reuses_them() -> None:
    """A warm standby restores into an index that already served (freed slab places): entries take
    the freed places first, and each place names its own entry."""
    idx, _, ns = make(chunks=16)
    for i in range(6):
        put(idx, ns, i, 4096)
    assert idx.delete(ns, key(1)) and idx.delete(ns, key(3))
    free = sorted(idx._free_slots)
    allocs = [idx.alloc.take(4096, [(4096, off)]) for off in (CHUNK * 8, CHUNK * 8 + 4096)]
    idx.restore_columns(["m/tp0"], [0, 0], [key(10), key(11)], allocs, [1, 2])
    placed = sorted(idx.entries[(ns, key(k))].slot for k in (10, 11))
    assert placed == free and not idx._free_slots
    assert all(e is None or idx.slab[e.slot] is e for e in idx.slab)
    with pytest.raises(ValueError):
        idx.restore_columns(["m/tp0"], [0], [key(12), key(13)], allocs, None)
