"""Untrusted bytes: the service and the slot server answer garbage with error replies and keep going."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import KVIndex
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op


def service() -> MetadataService:
    return MetadataService(KVIndex(Allocator(CHUNK, 16 * CHUNK)), epoch=7)


def test_roundtrip_of_every_payload_codec() -> None:
    keys = [bytes([i]) * 32 for i in range(5)]
    assert p.decode_lookup(p.encode_lookup(3, keys)) == (3, keys)
    assert p.decode_key(p.encode_key(2, b"k" * 40), "GET") == (2, b"k" * 40)
    assert p.decode_reserve(p.encode_reserve(2, b"k", 12345)) == (2, b"k", 12345)
    ext = [(4096, 100), (8192, 5)]
    assert p.decode_get_reply(p.encode_get_reply(9, 105, ext)) == (9, 105, ext)
    assert p.decode_reserve_reply(p.encode_reserve_reply(11, ext)) == (11, ext)
    assert p.decode_release(p.encode_release([1, 2, 3])) == [1, 2, 3]
    assert p.decode_name(p.encode_name("qwen/tp0")) == "qwen/tp0"
    stats = {k: i for i, k in enumerate(p.STATS_FIELDS)}
    assert p.decode_stats(p.encode_stats(stats)) == stats
    assert p.lookup_capacity(224, 32) == 6 and p.extents_capacity(224) == 12


def test_service_two_phase_put_through_bytes() -> None:
    s = service()
    code, rep = s.handle(Op.OPEN_NS, 7, p.encode_name("ns"), 224)
    ns = p.decode_u32(rep, "ns")
    code, rep = s.handle(Op.RESERVE, 7, p.encode_reserve(ns, b"a" * 32, 5000), 224)
    assert code == 0
    token, extents = p.decode_reserve_reply(rep)
    assert s.handle(Op.GET, 7, p.encode_key(ns, b"a" * 32), 224)[0] == Code.NOT_FOUND
    assert s.handle(Op.COMMIT, 7, p.encode_commit(token, 0x5EED), 224) == (0, b"")
    code, rep = s.handle(Op.GET, 7, p.encode_key(ns, b"a" * 32), 224)
    assert code == 0 and p.decode_get_reply(rep)[2] == extents
    assert s.handle(Op.COMMIT, 7, p.encode_commit(token, 0x5EED), 224)[0] == Code.NO_RESERVATION
    assert s.handle(Op.GET, 6, p.encode_key(ns, b"a" * 32), 224)[0] == Code.STALE_EPOCH
    assert s.errors["STALE_EPOCH"] == 1


def test_reply_that_does_not_fit_the_slot_gives_the_space_back() -> None:
    s = MetadataService(KVIndex(Allocator(CHUNK, 64 * CHUNK)), epoch=1)
    ns = p.decode_u32(s.handle(Op.OPEN_NS, 1, p.encode_name("ns"), 64)[1], "ns")
    # Fragment the area so a big block needs many extents, then ask for it with a tiny reply budget.
    tokens = []
    for i in range(60):
        _code, rep = s.handle(Op.RESERVE, 1, p.encode_reserve(ns, bytes([i]) * 8, CHUNK), 4096)
        tokens.append(p.decode_reserve_reply(rep)[0])
    used = s.index.alloc.used
    for token in tokens[::2]:
        s.index.abort(token)
    code, _ = s.handle(Op.RESERVE, 1, p.encode_reserve(ns, b"big" * 4, 20 * CHUNK), 64)
    assert code == Code.TOO_BIG
    assert s.index.alloc.used == used - 30 * CHUNK


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.integers(0, 70000), epoch=st.sampled_from([7, 0, 2**32 - 1]), payload=st.binary(max_size=300))
def test_service_never_raises_on_garbage(op: int, epoch: int, payload: bytes) -> None:
    s = service()
    s.index.open_namespace("ns")
    code, rep = s.handle(op, epoch, payload, 224)
    assert isinstance(code, int) and isinstance(rep, bytes) and len(rep) <= 224
    if code:
        assert s.error_count >= 1


@settings(max_examples=300, deadline=None)
@given(
    ns=st.integers(0, 2**32 - 1),
    count=st.integers(0, 2**16 - 1),
    klen=st.integers(0, 2**16 - 1),
    tail=st.binary(max_size=200),
)
def test_lookup_with_lying_lengths_is_rejected(ns: int, count: int, klen: int, tail: bytes) -> None:
    s = service()
    s.index.open_namespace("ns")
    payload = struct.pack("<IHH", ns, count, klen) + tail
    code, _ = s.handle(Op.LOOKUP_PREFIX, 7, payload, 224)
    valid = 0 < klen <= p.MAX_KEY and count > 0 and len(tail) >= count * klen and ns == 1
    assert (code == 0) == valid


def test_get_many_answers_in_order_and_stops_where_the_reply_is_full() -> None:
    s = service()
    ns = s.index.open_namespace("ns")
    keys = [bytes([i]) * 32 for i in range(8)]
    for k in keys[:6]:
        token, _ = s.index.reserve(ns, k, 5000)
        s.index.commit(token)
    code, rep = s.handle(Op.GET_MANY, 7, p.encode_lookup(ns, keys), 4096)
    items = p.decode_get_many_reply(rep)
    assert code == 0 and len(items) == 8
    assert [bool(lease) for lease, _n, _e in items] == [True] * 6 + [False] * 2
    assert all(n == 5000 and len(e) == 1 for lease, n, e in items[:6])
    # A small reply budget: only the first keys are answered, the rest stay unleased.
    leases_before = len(s.index.leases)
    code, rep = s.handle(Op.GET_MANY, 7, p.encode_lookup(ns, keys), 4 + 2 * (p._MANY_ITEM.size + 16))
    assert code == 0 and len(p.decode_get_many_reply(rep)) == 2
    assert len(s.index.leases) == leases_before + 2


def test_hello_reply_of_an_older_server_reads_as_an_unknown_writer_window_and_lease_ttl() -> None:
    import struct

    assert p.decode_hello_reply(struct.pack("<QII", 5, 42, 224)) == (5, 42, 224, 0, 0)
    assert p.decode_hello_reply(struct.pack("<QIII", 5, 42, 224, 30000)) == (5, 42, 224, 30000, 0)
    assert p.decode_hello_reply(p.encode_hello_reply(5, 42, 224, 30000, 10000)) == (5, 42, 224, 30000, 10000)
    with pytest.raises(p.ProtocolError):
        p.decode_hello_reply(struct.pack("<QIII", 5, 42, 224, 1)[:18])
