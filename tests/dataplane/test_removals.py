"""The removal log (bounded, cursor semantics) and the REMOVALS request, through the service's bytes."""

from __future__ import annotations

import pytest

from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.removal_log import WHY_DELETED, WHY_EVICTED, RemovalLog
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op

EPOCH = 5


def test_the_log_keeps_the_newest_and_counts_what_it_dropped() -> None:
    log = RemovalLog(4)
    assert (log.head, log.oldest, len(log)) == (1, 1, 0)
    for i in range(6):
        log.record(1 + i % 2, bytes([i]), WHY_EVICTED)
    assert (log.head, log.oldest, len(log)) == (7, 3, 4)
    assert [r.seq for r in log.records(*log.window(0))] == [3, 4, 5, 6]
    assert log.lost_before(0) == log.lost_before(1) == 2 and log.lost_before(3) == 0 and log.lost_before(7) == 0
    assert [r.key for r in log.records(*log.window(0), ns=2)] == [b"\x03", b"\x05"]
    assert log.window(5, budget=1) == (5, 6) and log.window(7) == (7, 7)
    with pytest.raises(ValueError):
        RemovalLog(0)


def _service(log_size: int = 64, chunks: int = 16) -> MetadataService:
    index = KVIndex(Allocator(CHUNK, chunks * CHUNK), IndexConfig(removal_log_size=log_size))
    return MetadataService(index, epoch=EPOCH)


def _ns(s: MetadataService, name: str) -> int:
    return p.decode_u32(s.handle(Op.OPEN_NS, EPOCH, p.encode_name(name), 224)[1], "ns")


def _put(s: MetadataService, ns: int, key: bytes, nbytes: int = 4096) -> None:
    code, rep = s.handle(Op.RESERVE, EPOCH, p.encode_reserve(ns, key, nbytes), 224)
    assert code == 0
    assert s.handle(Op.COMMIT, EPOCH, p.encode_commit(p.decode_reserve_reply(rep)[0], 0x5EED), 224)[0] == 0


def _ask(s: MetadataService, cursor: int, ns: int = 0, max_items: int = 0xFFFF, max_reply: int = 224):
    code, rep = s.handle(Op.REMOVALS, EPOCH, p.encode_removals(cursor, ns, max_items), max_reply)
    assert code == 0, Code(code).name
    return p.decode_removals_reply(rep)


def test_deletes_clears_and_evictions_are_recorded_with_why_per_namespace() -> None:
    s = _service(chunks=4)
    a, b = _ns(s, "a"), _ns(s, "b")
    keys = [bytes([i]) * 32 for i in range(4)]
    for k in keys[:3]:
        _put(s, a, k)
    _put(s, b, keys[3])
    assert _ask(s, 0) == (1, 1, 0, [])  # nothing removed yet
    assert s.handle(Op.DELETE, EPOCH, p.encode_key(a, keys[0]), 224)[0] == 0
    assert p.decode_u64(s.handle(Op.CLEAR_NS, EPOCH, p.encode_u32(b), 224)[1], "n") == 1
    nxt, head, lost, items = _ask(s, 0)
    assert (nxt, head, lost) == (3, 3, 0)
    assert items == [(a, 2, keys[0]), (b, 3, keys[3])]  # 2: deleted, 3: cleared
    assert _ask(s, 0, ns=b)[3] == [(b, 3, keys[3])]
    assert _ask(s, 3) == (3, 3, 0, [])
    # Fill the 4-chunk area with whole-chunk blocks: the reservation that cannot fit evicts the coldest.
    for i in range(6):
        _put(s, b, b"big%d" % i, CHUNK)
    evicted = [it for it in _ask(s, 3)[3] if it[1] == 1]
    assert evicted and all(ns in (a, b) for ns, _w, _k in evicted)
    assert s.index.counters.evictions == len(evicted)


def test_a_reply_carries_what_fits_and_the_cursor_resumes_there() -> None:
    s = _service()
    ns = _ns(s, "ns")
    keys = [bytes([i]) * 32 for i in range(12)]
    for k in keys:
        _put(s, ns, k)
        s.index.delete(ns, k)
    per_reply = p.removals_capacity(224, 32)
    assert per_reply == 5
    got: list[bytes] = []
    cursor = 0
    for _ in range(10):  # bounded: 12 removals take 3 replies
        nxt, head, lost, items = _ask(s, cursor)
        assert len(items) <= per_reply and lost == 0 and head == 13
        got += [k for _n, _w, k in items]
        cursor = nxt
        if cursor == head:
            break
    assert got == keys
    assert [k for *_x, k in _ask(s, 0, max_items=2)[3]] == keys[:2] and _ask(s, 0, max_items=2)[0] == 3
    head_query = _ask(s, 0, max_items=0)
    assert head_query[1:] == (13, 0, []) and head_query[0] == 1


def test_a_cursor_behind_the_bounded_log_is_told_what_it_lost() -> None:
    s = _service(log_size=4)
    ns = _ns(s, "ns")
    for i in range(10):
        k = bytes([i]) * 32
        _put(s, ns, k)
        s.index.delete(ns, k)
    nxt, head, lost, items = _ask(s, 2)
    assert (head, lost) == (11, 5) and [k[0] for _n, _w, k in items] == [6, 7, 8, 9]
    assert nxt == 11
    assert _ask(s, 11) == (11, 11, 0, [])


def test_refusals_of_removals_requests() -> None:
    s = _service()
    ns = _ns(s, "ns")
    _put(s, ns, b"k" * 32)
    s.index.delete(ns, b"k" * 32)

    def code(payload: bytes, max_reply: int = 224, epoch: int = EPOCH) -> int:
        return s.handle(Op.REMOVALS, epoch, payload, max_reply)[0]

    assert code(p.encode_removals(3)) == Code.BAD_ARGS  # past the head (2)
    assert code(p.encode_removals((1 << 64) - 1)) == Code.BAD_ARGS
    assert code(p.encode_removals(0, ns + 1)) == Code.UNKNOWN_NS
    assert code(p.encode_removals(0)[:15]) == Code.BAD_LENGTH
    assert code(p.encode_removals(0)[:12] + b"\0\0\1\0") == Code.BAD_ARGS  # unknown flags
    assert code(p.encode_removals(0), epoch=EPOCH - 1) == Code.STALE_EPOCH
    assert code(p.encode_removals(0), max_reply=8) == Code.TOO_BIG
    assert code(p.encode_removals(2)) == 0 and code(p.encode_removals(0)) == 0


def test_a_key_too_long_for_any_reply_is_skipped_and_counted_not_a_stall() -> None:
    s = _service()
    ns = _ns(s, "ns")
    for key in (b"L" * 250, b"s" * 32):
        _put(s, ns, key)
        s.index.delete(ns, key)
    nxt, head, lost, items = _ask(s, 0)
    assert (nxt, head, lost) == (3, 3, 1) and items == [(ns, WHY_DELETED, b"s" * 32)]
    assert _ask(s, 0, max_reply=1024)[3][0][2] == b"L" * 250  # a bigger slot carries it


def test_codecs_refuse_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        p.encode_removals(-1)
    with pytest.raises(ValueError):
        p.encode_removals(0, 0, 0x10000)
    with pytest.raises(p.ProtocolError):
        p.decode_removals_reply(p.encode_removals_reply(5, 4, 0, []))
    truncated = p.encode_removals_reply(2, 2, 0, [p.encode_removal_item(1, 1, b"x" * 32)])[:-1]
    with pytest.raises(p.ProtocolError):
        p.decode_removals_reply(truncated)
    assert p.removals_capacity(224, 0) == 0 and p.removals_capacity(1 << 20, 1) == 0xFFFF
