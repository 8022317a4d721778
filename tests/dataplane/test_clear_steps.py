"""A clear costs O(1) in the request that asks for it (issue 31 item 1): the namespace's map is
swapped for an empty one, the cleared entries are removed in steps between the loop's turns, and
meanwhile nothing finds them: not a Python lookup, not the native fast path (which hands the
namespace to Python until the clear is done), not a RESERVE of the same key (which removes the old
entry first, so the journal says REMOVE before the new COMMIT)."""

from __future__ import annotations

from pathlib import Path

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import CLEAR_STEP, HELD, IndexConfig, KVIndex
from belugactl.dataplane.mds.removal_log import WHY_CLEARED
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Op
from belugactl.dataplane.rpc.transport import CxlTransport
from tests.dataplane.test_slots import NS, make_server
from tests.support.blocks import zeros_crc

BLOCK = 4096


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def put(idx: KVIndex, ns: int, i: int) -> None:
    token, _ = idx.reserve(ns, key(i), BLOCK)
    idx.commit(token, checksum=zeros_crc(BLOCK))


def test_a_large_clear_is_deferred_invisible_at_once_and_finished_in_bounded_steps() -> None:
    idx = KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig())
    ns, other = idx.open_namespace("m/tp0"), idx.open_namespace("m/tp1")
    n = 3 * CLEAR_STEP + 7
    for i in range(n):
        put(idx, ns, i)
    for i in range(5):
        put(idx, other, i)
    used = idx.alloc.used
    removals = idx.removals.head

    assert idx.clear_namespace(ns) == n
    # Nothing was removed in the request: the work waits for the steps...
    assert idx.removals.head == removals and idx.alloc.used == used and idx.clearing == n
    # ...yet no lookup finds a cleared key, and the statistics count only what is visible.
    assert idx.lookup_prefix(ns, [key(0), key(1)]) == (0, 0)
    assert idx.get(ns, key(n - 1)) is None and not idx.delete(ns, key(3))
    assert idx.stats()["entries"] == 5 and idx.stats()["clearing"] == n
    assert idx.lookup_prefix(other, [key(0)])[0] == 1  # another namespace is untouched

    # A RESERVE of a cleared key removes the old entry first: its REMOVE precedes the new COMMIT.
    put(idx, ns, 7)
    assert idx.clearing == n - 1 and idx.lookup_prefix(ns, [key(7)])[0] == 1
    assert [(r.key, r.why) for r in idx.removals.records(removals, idx.removals.head)] == [(key(7), WHY_CLEARED)]

    steps = []
    while idx.background:
        steps.append(idx.background_step())
    assert max(steps) <= CLEAR_STEP  # each step bounded, whatever the namespace's size
    assert idx.clearing == 0 and idx.stats()["entries"] == 6
    assert idx.alloc.used == 6 * BLOCK  # every cleared block freed, the new one and the other's kept
    assert idx.lookup_prefix(ns, [key(7)])[0] == 1 and idx.get(ns, key(8)) is None


def test_an_entry_evicted_or_deleted_meanwhile_is_removed_once() -> None:
    idx = KVIndex(Allocator(CHUNK, 64 * CHUNK), IndexConfig())
    ns = idx.open_namespace("m/tp0")
    n = CLEAR_STEP + 10
    for i in range(n):
        put(idx, ns, i)
    before = idx.removals.head
    idx.clear_namespace(ns)
    # The cold end of the LRU is cleared entries: evicted, and counted once.
    assert idx.evict(target_free=idx.alloc.capacity, budget=3) == 3
    while idx.background:
        idx.background_step()
    kept = list(idx.removals.records(before, idx.removals.head))
    assert len(kept) == n and len({r.key for r in kept}) == n
    assert idx.clearing == 0 and idx.alloc.used == 0 and not idx.entries


def test_the_native_fast_path_leaves_a_namespace_being_cleared_to_python(pool_path: Path) -> None:
    pool, srv = make_server(pool_path)
    try:
        t = CxlTransport(pool, 1)

        def call(op: int, payload: bytes) -> tuple[int, bytes]:
            t.submit(op, srv.epoch, payload)
            srv.ring.serve(NS)  # the loop's way: the native burst first, then Python for what it leaves
            code, _epoch, rep = t.collect(NS)
            return code, rep

        t.submit(Op.HELLO, 0, p.encode_hello(3))
        assert srv.poll_once(NS) and t.collect(NS)[0] == 0
        idx = srv.index
        ns = idx.open_namespace("m/tp0")
        n = 2 * CLEAR_STEP
        for i in range(n):
            put(idx, ns, i)
        lookup = p.encode_lookup(ns, [key(0), key(1)])
        code, rep = call(Op.LOOKUP_PREFIX, lookup)
        assert code == 0 and p.decode_lookup_reply(rep)[0] == 2
        fast = srv.ring.fast_requests
        assert fast > 0  # the native fast path answered it

        assert idx.clear_namespace(ns) == n and idx.clearing == n
        assert idx._ns_slot is not None and idx._ns_slot[ns] == HELD
        code, rep = call(Op.LOOKUP_PREFIX, lookup)
        assert code == 0 and p.decode_lookup_reply(rep)[0] == 0  # the mirror still has them: not asked
        assert srv.ring.fast_requests == fast
        while idx.background:
            idx.background_step()
        assert idx._ns_slot[ns] != HELD
        put(idx, ns, 1)
        code, rep = call(Op.LOOKUP_PREFIX, p.encode_lookup(ns, [key(1)]))
        assert code == 0 and p.decode_lookup_reply(rep)[0] == 1
        assert srv.ring.fast_requests > fast  # the fast path has the namespace back
    finally:
        srv.close()
        pool.close()
