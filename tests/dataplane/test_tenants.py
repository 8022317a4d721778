"""Tenants in the index and the service: namespaces keyed by tenant, per-tenant quotas, fair
eviction, HELLO's tenant and bind_tenant (issue 30 item 2)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import IndexConfig, IndexError_, KVIndex
from belugactl.dataplane.mds.quotas import TenantSpec
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping

A, B = 1, 2  # two owners (rings), one per tenant
KEYS = 6  # one GET_MANY's keys: 32 B each, what a 256 B slot carries


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(*specs: TenantSpec, chunks: int = 8, **cfg) -> KVIndex:
    idx = KVIndex(Allocator(CHUNK, chunks * CHUNK), IndexConfig(**cfg), clock=Clock())
    idx.set_tenants(specs or (TenantSpec("a"), TenantSpec("b")), {A: "a", B: "b"})
    return idx


def as_(idx: KVIndex, owner: int) -> KVIndex:
    idx.begin_request(owner)
    return idx


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def put(idx: KVIndex, owner: int, ns: int, i: int, n: int = CHUNK) -> None:
    token, _ = as_(idx, owner).reserve(ns, key(i), n, owner)
    idx.commit(token, owner, 1)


def test_a_namespace_is_its_tenants_and_another_tenant_cannot_touch_it() -> None:
    idx = make()
    ns_a = as_(idx, A).open_namespace("m/tp0")
    put(idx, A, ns_a, 1)
    ns_b = as_(idx, B).open_namespace("m/tp0")
    assert ns_b != ns_a  # the same name is another namespace for another tenant
    assert as_(idx, A).open_namespace("m/tp0") == ns_a
    as_(idx, B)
    for attempt in (
        lambda: idx.lookup_prefix(ns_a, [key(1)]),
        lambda: idx.get(ns_a, key(1)),
        lambda: idx.reserve(ns_a, key(2), 4096, B),
        lambda: idx.delete(ns_a, key(1)),
        lambda: idx.clear_namespace(ns_a),
    ):
        with pytest.raises(IndexError_) as info:
            attempt()
        assert info.value.code == "UNKNOWN_NS"
    assert as_(idx, A).lookup_prefix(ns_a, [key(1)])[0] == 1  # untouched
    with pytest.raises(IndexError_):
        idx.open_namespace("b\x00m/tp0")  # no NUL: a name cannot spell another tenant's key


def test_tenant_quotas_bound_leases_reserved_stored_bytes_and_namespaces() -> None:
    idx = make(TenantSpec("a", live_leases=3, reserved_bytes=2 * CHUNK, namespaces=2), TenantSpec("b"))
    ns = as_(idx, A).open_namespace("x")
    put(idx, A, ns, 1)
    leases = [as_(idx, A).lookup_prefix(ns, [key(1)])[1] for _ in range(5)]
    assert [bool(x) for x in leases] == [True] * 3 + [False] * 2  # a miss past the tenant's 3 live leases
    assert idx.tenants.by_name["a"].refused["leases"] == 2
    idx.release(leases[:1])
    assert as_(idx, A).lookup_prefix(ns, [key(1)])[1]  # room again
    # reserved bytes: a second reservation past 2 chunks is QUOTA (before anything is evicted)
    t1, _ = as_(idx, A).reserve(ns, key(2), CHUNK + 4096, A)
    with pytest.raises(IndexError_) as info:
        idx.reserve(ns, key(3), CHUNK, A)
    assert info.value.code == "QUOTA" and idx.tenants.by_name["a"].refused["reserved_bytes"] == 1
    idx.abort(t1, A)
    # namespaces: the third is QUOTA; tenant b is not affected
    as_(idx, A).open_namespace("y")
    with pytest.raises(IndexError_) as info:
        idx.open_namespace("z")
    assert info.value.code == "QUOTA"
    assert as_(idx, B).open_namespace("z")


def test_over_its_stored_quota_a_tenant_evicts_its_own_coldest_blocks_not_others() -> None:
    idx = make(TenantSpec("a", stored_bytes=3 * CHUNK), TenantSpec("b"), chunks=16)
    ns_a = as_(idx, A).open_namespace("x")
    ns_b = as_(idx, B).open_namespace("x")
    put(idx, B, ns_b, 100)
    for i in range(3):
        put(idx, A, ns_a, i)
    put(idx, A, ns_a, 3)  # over a's 3 chunks: its coldest (0) goes, not b's
    assert (ns_a, key(0)) not in idx.entries and (ns_b, key(100)) in idx.entries
    assert idx.tenants.by_name["a"].stored_bytes == 3 * CHUNK
    assert idx.tenants.by_name["a"].evicted == 1 and idx.tenants.by_name["b"].evicted == 0
    # a block a's quota cannot hold even after eviction is QUOTA
    with pytest.raises(IndexError_) as info:
        as_(idx, A).reserve(ns_a, key(9), 4 * CHUNK, A)
    assert info.value.code == "QUOTA"


def test_eviction_takes_from_the_tenant_furthest_above_its_weighted_share() -> None:
    # 8 chunks; a weight 1, b weight 3: shares 2 and 6 chunks. a fills 6, b stores 2.
    # (b listed first: the choice is by share, not by order)
    idx = make(TenantSpec("b", weight=3), TenantSpec("a", weight=1), high_watermark=1.0, low_watermark=1.0)
    ns_a = as_(idx, A).open_namespace("x")
    ns_b = as_(idx, B).open_namespace("x")
    for i in range(6):
        put(idx, A, ns_a, i)
    put(idx, B, ns_b, 100)
    put(idx, B, ns_b, 101)
    assert idx.alloc.used == idx.alloc.capacity
    # b needs room: a (4 chunks above its share) pays, b's older blocks stay although they are colder
    put(idx, B, ns_b, 102)
    put(idx, B, ns_b, 103)
    assert {(ns_b, key(i)) for i in (100, 101, 102, 103)} <= set(idx.entries)
    assert sum((ns_a, key(i)) in idx.entries for i in range(6)) == 4
    # a, now at 4 chunks (above its 2), writing more evicts its own blocks, never b's (at its share)
    put(idx, A, ns_a, 6)
    assert {(ns_b, key(i)) for i in (100, 101, 102, 103)} <= set(idx.entries)
    assert idx.tenants.by_name["b"].evicted == 0 and idx.tenants.by_name["a"].evicted == 3
    # the watermark eviction is fair too: it takes a's coldest
    idx.config.low_watermark = 0.75
    idx.evict()
    assert idx.tenants.by_name["b"].evicted == 0
    # b fills the free space up to its share; a's blocks all leased: a's next write finds nothing of
    # its own to evict, and b (not above its share) is not evicted for it: POOL_FULL
    i = 104
    while idx.alloc.used < idx.alloc.capacity:
        put(idx, B, ns_b, i)
        i += 1
    assert idx.tenants.by_name["b"].stored_bytes <= 6 * CHUNK
    for i in range(7):
        if (ns_a, key(i)) in idx.entries:
            assert as_(idx, A).lookup_prefix(ns_a, [key(i)])[1]
    with pytest.raises(IndexError_) as info:
        as_(idx, A).reserve(ns_a, key(50), CHUNK, A)
    assert info.value.code == "POOL_FULL" and idx.tenants.by_name["b"].evicted == 0


def test_without_tenants_everything_is_the_implicit_tenants_as_before() -> None:
    idx = KVIndex(Allocator(CHUNK, 4 * CHUNK), IndexConfig(high_watermark=1.0, low_watermark=1.0), clock=Clock())
    ns = idx.open_namespace("m")
    for i in range(5):
        token, _ = idx.reserve(ns, key(i), CHUNK)
        idx.commit(token, None, 1)
    assert (ns, key(0)) not in idx.entries and len(idx.entries) == 4  # plain LRU
    assert idx.lru is idx.tenants.default.lru and idx.stats()["tenants"]["_implicit"]["entries"] == 4


def service(*specs: TenantSpec) -> MetadataService:
    idx = make(*specs)
    s = MetadataService(idx, epoch=7)
    s.rings = 4  # owners 0..3 are rings; 4 on are TCP connections
    return s


def hello(s: MetadataService, owner: int, tenant: str = "") -> int:
    return s.handle(Op.HELLO, 0, p.encode_hello(9, 0, 0, tenant), 4096, owner)[0]


def test_hello_names_the_tenant_and_a_bound_connection_cannot_claim_another() -> None:
    s = service(TenantSpec("a", connections=1), TenantSpec("b"))
    assert hello(s, 10, "a") == 0 and s.index.tenants.of(10).name == "a"
    assert hello(s, 11, "a") == Code.QUOTA  # a's one connection is taken
    assert hello(s, 11, "nobody") == Code.NOT_OWNER  # a tenant the manifest does not name
    assert hello(s, 11, "b") == 0
    s.forget_owner(10)  # closed: a's connection is free again, and owner 10 is nobody's
    assert s.index.tenants.of(10) is s.index.tenants.default
    assert s.bind_tenant(12, "a") and not s.bind_tenant(13, "zzz")
    assert hello(s, 12, "b") == Code.NOT_OWNER  # authenticated as a, claiming b
    assert hello(s, 12, "") == 0 and s.index.tenants.of(12).name == "a"  # the bound one
    assert hello(s, A, "b") == Code.NOT_OWNER  # ring 1 is a's instance's, whatever it says
    assert hello(s, A, "a") == 0 and hello(s, A) == 0
    # an old client's HELLO (no tenant, no group) still works
    assert s.handle(Op.HELLO, 0, struct.pack("<II", 9, 0), 4096, 20)[0] == 0


def test_removals_of_another_tenant_are_not_listed() -> None:
    s = service()
    idx = s.index
    ns_a = as_(idx, A).open_namespace("x")
    ns_b = as_(idx, B).open_namespace("x")
    put(idx, A, ns_a, 1)
    put(idx, B, ns_b, 2)
    idx.delete(ns_b, key(2))
    as_(idx, A).delete(ns_a, key(1))
    code, rep = s.handle(Op.REMOVALS, 7, p.encode_removals(0, 0, 100), 4096, B)
    assert code == 0
    items = p.decode_removals_reply(rep)[3]
    assert [it[2] for it in items] == [key(2)]
    code, _ = s.handle(Op.REMOVALS, 7, p.encode_removals(0, ns_a, 100), 4096, B)
    assert code == Code.UNKNOWN_NS


@pytest.mark.native
def test_fast_path_leases_count_against_the_ring_and_its_tenant(pool_path: Path) -> None:
    """The native fast path grants a ring no lease past its or its tenant's room: GET_MANYs naming
    one key over and over through the rings hold at most the tenant's quota of leases."""
    if native.fast_serve is None:
        pytest.skip("no native fast path")
    from belugactl.dataplane.rpc.transport import CxlTransport

    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.index.set_tenants([TenantSpec("a", live_leases=3), TenantSpec("b")], {1: "a", 2: "b"})
    server.start()
    try:
        t = CxlTransport(pool, 1)
        idx = server.index
        ns = as_(idx, 1).open_namespace("m")
        put(idx, 1, ns, 1, 4096)
        burst = p.encode_lookup(ns, [key(1)] * KEYS)
        a = idx.tenants.by_name["a"]
        for _ in range(4):
            t.submit(Op.GET_MANY, server.epoch, burst)
            served, stop = server.ring.fast_burst(0, 5_000_000_000)
            if stop >= 0:  # left to Python (the C path answers keys past the room as absent itself)
                assert server.poll_once(0)
            code, _e, rep = t.collect(5_000_000_000)
            assert code == 0 and p.decode_get_many_reply(rep)
        assert a.live_leases <= 3 and idx.stats()["leases"] <= 3
        assert idx.stats()["tenants"]["a"]["refused"]["leases"] > 0  # counted, in C or in Python
        assert idx.room is not None and idx.room.room[a.slot] == 3 - a.live_leases >= 0
        # small bursts the fast path answers are counted in the ring's quota and its tenant's
        idx.clock = lambda: 1e12  # every lease so far expires
        idx.expire()
        assert a.live_leases == 0 and idx.room.room[a.slot] == 3
        before = a.live_leases
        t.submit(Op.LOOKUP_PREFIX, server.epoch, p.encode_lookup(ns, [key(1)]))
        served, stop = server.ring.fast_burst(0, 5_000_000_000)
        assert served == 1 and stop < 0
        t.collect(5_000_000_000)
        assert a.live_leases == before + 1 and idx.quotas.of(1).live_leases >= 1
        assert idx.room.room[a.slot] == 3 - a.live_leases
    finally:
        server.close()
        pool.close()


def test_a_journal_restart_gives_each_block_back_to_its_tenant(pool_path: Path) -> None:
    specs, rings = [TenantSpec("a"), TenantSpec("b")], {A: "a", B: "b"}

    def start() -> tuple[PoolMapping, MetadataServer]:
        pool = PoolMapping.open(pool_path)
        server = MetadataServer(
            pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, restart_policy="journal")
        )
        server.index.set_tenants(specs, rings)
        server.start()
        return pool, server

    pool, first = start()
    ns_a = as_(first.index, A).open_namespace("m")
    put(first.index, A, ns_a, 1, 4096)
    first.close()
    pool.close()
    pool, second = start()
    try:
        idx = second.index
        assert second.restored_entries == 1
        assert as_(idx, B).get(as_(idx, B).open_namespace("m"), key(1)) is None  # b's "m" is another
        ns = as_(idx, A).open_namespace("m")
        assert idx.get(ns, key(1)) is not None
        assert idx.tenants.by_name["a"].stored_bytes == 4096 and idx.tenants.by_name["b"].stored_bytes == 0
    finally:
        second.close()
        pool.close()


@pytest.mark.native
def test_the_fast_path_answers_a_ring_only_in_its_own_tenants_namespaces(pool_path: Path) -> None:
    """A ring of tenant b naming tenant a's namespace id is not answered from the native mirror: the
    request goes to Python, which answers UNKNOWN_NS (lookup, GET, GET_MANY alike)."""
    if native.fast_serve is None:
        pytest.skip("no native fast path")
    from belugactl.dataplane.rpc.transport import CxlTransport

    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.index.set_tenants([TenantSpec("a"), TenantSpec("b")], {1: "a", 2: "b"})
    server.start()
    try:
        idx = server.index
        ns_a = as_(idx, 1).open_namespace("m")
        for owner in (3, 4, 5):  # past the first ns_slot array (1,024): the grown one is handed to C
            for i in range(370):
                as_(idx, owner).open_namespace(f"n{owner}-{i}")
        put(idx, 1, ns_a, 1, 4096)
        mine, theirs = CxlTransport(pool, 1), CxlTransport(pool, 2)
        for op, payload in (
            (Op.LOOKUP_PREFIX, p.encode_lookup(ns_a, [key(1)])),
            (Op.GET, p.encode_key(ns_a, key(1))),
            (Op.GET_MANY, p.encode_lookup(ns_a, [key(1)])),
        ):
            for t, expect in ((theirs, Code.UNKNOWN_NS), (mine, Code.OK)):
                t.submit(op, server.epoch, payload)
                served, stop = server.ring.fast_burst(0, 5_000_000_000)
                if stop >= 0:
                    assert server.poll_once(0)
                code, _e, _rep = t.collect(5_000_000_000)
                assert code == expect, op.name
        assert idx.entries[(ns_a, key(1))].leases == 3  # a's own three, none for b
    finally:
        server.close()
        pool.close()


def test_emptying_a_chunk_never_takes_the_blocks_of_a_tenant_at_its_share() -> None:
    # a (weight 1, share 2 chunks) and b (weight 3, share 6) share chunks 0-3 block by block (the
    # coldest); chunks 4-7 are a's alone. a's 2 MiB block needs a free chunk: the mixed chunks hold
    # b's blocks (b is under its share), so one of a's own chunks is emptied, nothing of b's.
    idx = make(TenantSpec("a", weight=1), TenantSpec("b", weight=3), high_watermark=1.0, low_watermark=1.0)
    ns_a = as_(idx, A).open_namespace("x")
    ns_b = as_(idx, B).open_namespace("x")
    small = 64 << 10
    per = CHUNK // small
    for i in range(4 * per // 2):  # alternate: every mixed chunk holds both tenants' blocks
        put(idx, A, ns_a, i, small)
        put(idx, B, ns_b, i, small)
    for i in range(4 * per // 2, 4 * per // 2 + 4 * per):
        put(idx, A, ns_a, i, small)
    assert idx.alloc.used == idx.alloc.capacity
    b_before = {k for k in idx.entries if k[0] == ns_b}
    put(idx, A, ns_a, 100_000, CHUNK)
    assert {k for k in idx.entries if k[0] == ns_b} == b_before
    assert idx.tenants.by_name["a"].evicted == per and idx.tenants.by_name["b"].evicted == 0
    assert all((ns_a, key(i)) in idx.entries for i in range(4 * per // 2))  # a's blocks in mixed chunks stay
