"""The native lookup fast path answers exactly what the Python index would, and its leases count."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belugactl.dataplane import native
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.mapping import PoolMapping

pytestmark = pytest.mark.native  # skipped (failing in CI) when the helper is not built: see conftest.py
NS = 5_000_000_000



def seq_of(server, lease_id: int) -> int:
    """The index's sequence number of a wire lease id (granted to ring 1, the tests' ring)."""
    seq, owner = server.service.leases.decode(lease_id)
    assert owner == 1
    return seq

def setup(pool_path: Path):
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.start()
    t = CxlTransport(pool, 1)
    ns = server.index.open_namespace("m/tp0")
    return pool, server, t, ns


def put(server: MetadataServer, ns: int, key: bytes, n: int = 4096) -> None:
    token, _ = server.index.reserve(ns, key, n)
    server.index.commit(token)


def fast_call(server: MetadataServer, t: CxlTransport, op: int, payload: bytes):
    t.submit(op, server.epoch, payload)
    served, stop = server.ring.fast_burst(0, NS)
    if stop >= 0:  # handed back to Python
        assert server.poll_once(0)
    return served, t.collect(NS)


def test_fast_lookups_match_the_index_and_grant_leases(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    keys = [bytes([i]) * 32 for i in range(6)]
    for k in keys[:4]:
        put(server, ns, k)
    for chain, expected in ((keys, 4), (keys[1:], 3), (keys[4:], 0), (keys[:1], 1)):
        served, (code, _e, rep) = fast_call(server, t, Op.LOOKUP_PREFIX, p.encode_lookup(ns, chain))
        assert served == 1 and code == 0
        count, lease = p.decode_lookup_reply(rep)
        assert count == expected == server.index.lookup_prefix(ns, chain)[0]
        assert (lease != 0) == (expected > 0)
        if lease:
            assert [e.key[1] for e in server.index.lease_entries(seq_of(server, lease))] == chain[:expected]
    assert server.index.entries[(ns, keys[0])].leases == 4  # 2 fast leases + 2 from the index calls above
    assert server.ring.fast_requests == 4 and server.service.ops["LOOKUP_PREFIX"] == 4
    server.close()
    pool.close()


def test_fast_leases_protect_blocks_from_eviction(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    server.index.config.high_watermark = 1.0
    server.index.config.low_watermark = 0.0
    hot = b"h" * 32
    put(server, ns, hot, 1 << 20)
    put(server, ns, b"c" * 32, 1 << 20)
    fast_call(server, t, Op.LOOKUP_PREFIX, p.encode_lookup(ns, [hot]))
    server.index.evict(target_free=server.allocator.capacity)
    assert (ns, hot) in server.index.entries and (ns, b"c" * 32) not in server.index.entries
    server.close()
    pool.close()


def test_deleted_and_unknown_and_long_keys(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    put(server, ns, b"d" * 32)
    server.index.delete(ns, b"d" * 32)
    _served, (code, _e, rep) = fast_call(server, t, Op.LOOKUP_PREFIX, p.encode_lookup(ns, [b"d" * 32]))
    assert code == 0 and p.decode_lookup_reply(rep)[0] == 0
    # An unknown namespace goes to Python, which answers UNKNOWN_NS.
    served, (code, _e, _r) = fast_call(server, t, Op.LOOKUP_PREFIX, p.encode_lookup(99, [b"d" * 32]))
    assert served == 0 and code == Code.UNKNOWN_NS
    # Keys longer than the mirror holds are answered by Python, correctly.
    long_key = b"L" * 100
    put(server, ns, long_key)
    assert server.index.mirror_misses == 1
    t2 = CxlTransport(pool, 0)
    t2.submit(Op.LOOKUP_PREFIX, server.epoch, p.encode_lookup(ns, [long_key]))
    served, stop = server.ring.fast_burst(0, NS)
    assert served == 0 and stop >= 0
    assert server.poll_once(0)
    assert p.decode_lookup_reply(t2.collect(NS)[2])[0] == 1
    # Other opcodes, a stale epoch and pings.
    _s, (code, _e, rep) = fast_call(server, t, Op.PING, b"hi")
    assert code == 0 and rep == b"hi"
    t.submit(Op.LOOKUP_PREFIX, server.epoch + 1, p.encode_lookup(ns, [b"d" * 32]))
    served, stop = server.ring.fast_burst(0, NS)
    assert served == 0 and stop >= 0 and server.poll_once(0)
    assert t.collect(NS)[0] == Code.STALE_EPOCH
    server.close()
    pool.close()


def test_fast_serve_refuses_inconsistent_arrays(pool_path: Path) -> None:
    pool, server, _t, _ns = setup(pool_path)
    h = server.service.latency_by_op[Op.LOOKUP_PREFIX]
    from array import array

    bad_offs = array("q", [pool.size] * len(server.ring._offs))
    with pytest.raises(ValueError):
        native.fast_serve(server.ring._fast, pool.buf, bad_offs, server.ring._cursor, 8, 256, 1, 1, False, 0, 0, 1, 1,
                          h.bounds_ns, h.counts, server.service.leases.key_bytes)  # fmt: skip
    server.close()
    pool.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from([3, 12, 3, 4, 999]),
    length=st.integers(0, 240),
    payload=st.binary(min_size=0, max_size=224),
    good_epoch=st.booleans(),
)
def test_native_path_survives_hostile_slots(pool_path: Path, op: int, length: int, payload: bytes, good_epoch: bool):
    pool, server, t, ns = setup(pool_path)
    put(server, ns, b"x" * 8)
    g = pool.geometry
    ring = 2
    off = g.slot_offset(ring, 0)
    seq = 5 * g.slots_per_ring  # a plausible sequence number for slot 0
    epoch = server.epoch if good_epoch else server.epoch + 7
    pool.buf[off + 32 : off + 32 + len(payload)] = payload
    struct.pack_into("<QQIIHHI", pool.buf, off, 0, seq, p.MAGIC, epoch, op, 0, length)
    native.store64(pool.buf, off, p.REQ_READY)
    served, stop = server.ring.fast_burst(0, 0)
    if stop >= 0:
        assert server.poll_once(0)
    assert native.load64(pool.buf, off) == p.RESP_READY
    code = struct.unpack_from("<H", pool.buf, off + 26)[0]
    if not good_epoch and op != 999 and length <= g.slot_size - 32:
        assert code == Code.STALE_EPOCH
    if op == 999 and length <= g.slot_size - 32:
        assert code == Code.BAD_OP
    if length > g.slot_size - 32:
        assert code == Code.BAD_LENGTH
    # The server still answers an honest client.
    _s, (code, _e, rep) = fast_call(server, CxlTransport(pool, 0), Op.LOOKUP_PREFIX, p.encode_lookup(ns, [b"x" * 8]))
    assert code == 0 and p.decode_lookup_reply(rep)[0] == 1
    server.close()
    pool.close()


def test_fast_lease_bursts_release_and_expire(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    index = server.index
    key = b"a" * 32
    put(server, ns, key, 8192)
    for _ in range(3):  # three lookups in flight: one native burst answers them all
        t.submit(Op.LOOKUP_PREFIX, server.epoch, p.encode_lookup(ns, [key]))
    served, stop = server.ring.fast_burst(0, NS)
    assert (served, stop) == (3, -1)
    leases = [p.decode_lookup_reply(t.collect(NS)[2])[1] for _ in range(3)]
    entry = index.entries[(ns, key)]
    assert entry.leases == 3 and index.stats()["leases"] == 3 and len(set(leases)) == 3
    seqs = [seq_of(server, lid) for lid in leases]
    assert index.release([seqs[1]]) == 1 and index.release([seqs[1]]) == 0
    assert entry.leases == 2 and index.lease_entries(seqs[0]) == [entry]
    assert index.delete(ns, key) and index.get(ns, key) is None
    assert index.alloc.used > 0  # still leased: the bytes stay valid for the readers
    now = index.clock()
    index.clock = lambda: now + index.config.lease_ttl_s + 1
    index.expire()
    assert entry.leases == 0 and index.alloc.used == 0 and entry.id not in index.by_id
    assert index.stats()["leases"] == 0 and index.counters.leases_expired == 2
    server.close()
    pool.close()


def test_fast_get_returns_the_extents_with_a_lease(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    index = server.index
    key = b"g" * 32
    put(server, ns, key, 3 * (1 << 20) + 5)  # whole chunks plus a tail: several extents
    entry = index.entries[(ns, key)]
    served, (code, _e, rep) = fast_call(server, t, Op.GET, p.encode_key(ns, key))
    assert served == 1 and code == 0
    lease, nbytes, extents = p.decode_get_reply(rep)
    assert nbytes == entry.alloc.nbytes and extents == entry.alloc.extents and lease
    assert entry.leases == 1 and index.lease_entries(seq_of(server, lease)) == [entry]
    assert server.service.ops["GET"] == 1
    index.delete(ns, key)
    used = index.alloc.used
    assert used > 0 and index.release([seq_of(server, lease)]) == 1 and index.alloc.used == 0
    # A miss is answered by Python (NOT_FOUND, counted as an error reply).
    served, (code, _e, _r) = fast_call(server, t, Op.GET, p.encode_key(ns, key))
    assert served == 0 and code == Code.NOT_FOUND and server.service.errors["NOT_FOUND"] == 1
    server.close()
    pool.close()


def test_fast_get_many_answers_as_python_does_hits_misses_and_a_full_reply(pool_path: Path) -> None:
    pool, server, t, ns = setup(pool_path)
    keys = [bytes([i]) * 32 for i in range(8)]
    for i, k in enumerate(keys):
        if i % 3 != 1:  # keys 1, 4, 7 are misses, in the middle and at the end
            put(server, ns, k, 4096 * (i + 1))
    want = []
    for k in keys:  # what Python answers (its own leases, released)
        got = server.index.get(ns, k)
        want.append(None if got is None else (got[0].alloc.nbytes, list(got[0].alloc.extents), got[0].checksum))
        if got is not None:
            server.index.release([got[1]])
    before = server.index.counters.hits, server.index.counters.misses
    served, (code, _e, rep) = fast_call(server, t, Op.GET_MANY, p.encode_lookup(ns, keys[:5]))
    assert served == 1 and code == 0  # answered natively
    items = p.decode_get_many_reply_ex(rep)
    assert [None if lease == 0 else (n, ext, crc) for lease, n, ext, crc in items] == want[:5]
    assert (server.index.counters.hits - before[0], server.index.counters.misses - before[1]) == (3, 2)
    assert server.service.ops["GET_MANY"] == 1
    leases = [lease for lease, *_ in items if lease]
    assert len(set(leases)) == 3 and all(server.index.entries[(ns, keys[i])].leases == 1 for i in (0, 2, 3))
    assert server.index.release([seq_of(server, x) for x in leases]) == 3
    assert all(server.index.entries[(ns, keys[i])].leases == 0 for i in (0, 2, 3))
    # More keys than one reply carries: a prefix is answered, and nothing beyond it is leased.
    many = [bytes([i]) * 32 for i in range(40, 46)]
    for k in many:
        put(server, ns, k)
    served, (code, _e, rep) = fast_call(server, t, Op.GET_MANY, p.encode_lookup(ns, many))
    items = p.decode_get_many_reply_ex(rep)
    answered = len(items)
    assert served == 1 and code == 0 and 0 < answered < len(many)
    assert [server.index.entries[(ns, k)].leases for k in many] == [1] * answered + [0] * (len(many) - answered)
    # Malformed requests are Python's, which refuses them; the ring keeps serving.
    for bad in (b"", struct.pack("<IHH", ns, 0, 32), struct.pack("<IHH", ns, 2, 32) + b"x" * 40):
        served, (code, _e, _r) = fast_call(server, t, Op.GET_MANY, bad)
        assert served == 0 and code != 0
    served, (code, _e, rep) = fast_call(server, t, Op.GET_MANY, p.encode_lookup(ns, keys[:1]))
    assert served == 1 and code == 0 and p.decode_get_many_reply_ex(rep)[0][0] != 0
    server.close()
    pool.close()
