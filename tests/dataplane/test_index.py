from __future__ import annotations

import pytest

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import IndexConfig, IndexError_, KVIndex


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
    put(idx, ns, 8)  # 10 chunks used > 90 %: evict down to 50 %
    assert idx.alloc.used <= 5 * CHUNK
    present = {i for i in range(9) if (ns, key(i)) in idx.entries}
    assert {0, 1} <= present  # leased blocks survive
    assert 8 in present  # the newest survives: LRU evicts from the cold end
    assert 2 not in present and idx.counters.evictions >= 4
    idx.commit(pending)  # the pending block was not touched by eviction
    assert idx.get(ns, key(100)) is not None
    assert lease


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
