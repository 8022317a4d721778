"""Hostile REMOVALS requests on both transports: malformed and lying payloads, cursors past the head
or from an earlier server (epoch), and floods of requests and of removals. Each is refused or
answered within bounds, the server keeps serving, and its memory stays bounded."""

from __future__ import annotations

import struct
import time

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import RequestRejected, StaleEpoch
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, start_mds, well_behaved_round_trip
from tests.support.blocks import zeros_crc

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(420)]
MiB = 1 << 20


def _raw(client, op: int, payload: bytes, epoch32: int | None = None) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side checks) and return the server's code and reply."""
    code, _epoch, reply = client.transport.call(op, client._epoch32 if epoch32 is None else epoch32, payload, int(5e9))
    return code, reply


def _keys(n: int, tag: bytes) -> list[bytes]:
    return [tag + b"%05d" % i + b"." * (27 - len(tag)) for i in range(n)]


def _removed(c, n: int, tag: bytes) -> list[bytes]:
    """Put and delete n blocks: n removals (why: deleted) in NS."""
    keys = _keys(n, tag)
    for k in keys:
        r = c.reserve(NS, k, 4096)
        c.commit(r.token, zeros_crc(r.nbytes))
        assert c.delete(NS, k)
    return keys


def _cleared(c, n: int, tag: bytes) -> None:
    """Put n blocks in two bursts and clear the namespace: n removals (why: cleared), quickly."""
    got = c.reserve_many(NS, [(k, 4096) for k in _keys(n, tag)])
    assert c.commit_many([(r.token, zeros_crc(4096)) for r in got]) == [Code.OK] * n
    assert c.clear_namespace(NS) >= n


@pytest.mark.parametrize("kind", ["cxl", "tcp"])
def test_malformed_and_lying_requests_are_refused_and_the_server_serves_on(mds, kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    c = connect(mds.cxl(1), pool=pool, timeout_s=5) if kind == "cxl" else connect(mds.tcp, timeout_s=5)
    keys = _removed(c, 3, kind.encode())
    ns = c._ns_id(NS)
    head = c.removals_since(0, max_items=0).head
    good = p.encode_removals(0, ns)
    attacks = {
        "empty": (b"", Code.BAD_LENGTH),
        "truncated": (good[:11], Code.BAD_LENGTH),
        "unknown flags": (good[:14] + struct.pack("<H", 0x8000), Code.BAD_ARGS),
        "cursor one past the head": (p.encode_removals(head + 1, ns), Code.BAD_ARGS),
        "cursor 2^64-1": (struct.pack("<QIHH", (1 << 64) - 1, ns, 5, 0), Code.BAD_ARGS),
        "namespace never issued": (p.encode_removals(0, 0xFFFFFFFF), Code.UNKNOWN_NS),
    }
    for name, (payload, want) in attacks.items():
        assert _raw(c, Op.REMOVALS, payload)[0] == want, name
    # Trailing garbage after a good request is ignored (as for every request), not misread.
    code, reply = _raw(c, Op.REMOVALS, good + b"\xff" * 64)
    assert code == 0 and [k for _n, _w, k in p.decode_removals_reply(reply)[3]] == keys
    # max items 0xFFFF: the reply is bounded by the slot / frame, never by the client's ask.
    code, reply = _raw(c, Op.REMOVALS, struct.pack("<QIHH", 0, 0, 0xFFFF, 0))
    assert code == 0 and len(reply) <= c.transport.max_payload
    with pytest.raises(RequestRejected):
        c.removals_since(head + 10)
    well_behaved_round_trip(mds.cxl(4) if kind == "cxl" else mds.tcp, pool, b"after-" + kind.encode() + b"." * 26)
    got = c.removals_since(0, NS)
    assert [r.key for r in got.items] == keys and {r.why for r in got.items} == {"deleted"} and got.caught_up
    c.close()
    pool.close()


def test_a_cursor_from_before_a_restart_is_fenced_then_refused(manifest_path, pool_path) -> None:
    pool = PoolMapping.open(pool_path)
    with start_mds(manifest_path, pool_path, "--reservation-ttl", "2", "--fence-grace", "0") as first:
        old = connect(first.cxl(1), pool=pool, timeout_s=5)  # a ring outlives the server: same address after
        _removed(old, 20, b"old")
        before = old.removals_since(0, NS)
        old_epoch32 = old._epoch32
        assert before.head == 21 and before.epoch == old.epoch
    with start_mds(manifest_path, pool_path, "--reservation-ttl", "2", "--fence-grace", "0") as second:
        # The old client's next request carries the old epoch: fenced before its cursor is read.
        with pytest.raises(StaleEpoch):
            old.removals_since(before.next_cursor, NS)
        fresh = connect(second.tcp, timeout_s=5)
        assert fresh.epoch != before.epoch
        code, _ = _raw(fresh, Op.REMOVALS, p.encode_removals(0), epoch32=old_epoch32)
        assert code == Code.STALE_EPOCH
        # Under the new epoch the old cursor (21) is past the new log's head (1): refused, not misread.
        code, _ = _raw(fresh, Op.REMOVALS, p.encode_removals(before.next_cursor))
        assert code == Code.BAD_ARGS
        head_query = fresh.removals_since(0, max_items=0)
        assert (head_query.head, head_query.lost, head_query.items) == (1, 0, [])
        old.reconnect()
        assert old.removals_since(0, NS).items == []  # the new server removed nothing yet
        well_behaved_round_trip(second.tcp, pool, b"after-restart".ljust(32, b"."))
        assert second.proc.poll() is None
        old.close()
        fresh.close()
    pool.close()


def test_floods_of_requests_and_of_removals_stay_bounded(mds) -> None:
    pool = PoolMapping.open(mds.pool_path)
    # Generous timeouts: clearing 1000 keys is the server's slowest request, and on a loaded 2-core CI
    # machine it has taken more than 5 s; the bounds asserted below do not depend on speed.
    writer = connect(mds.tcp, timeout_s=60)
    readers = [connect(mds.cxl(2 + i), pool=pool, timeout_s=60) for i in range(2)] + [connect(mds.tcp, timeout_s=60)]
    _removed(writer, 50, b"warm")
    rss0 = mds.rss()
    deadline = time.monotonic() + 240
    asked = 0
    for _round in range(18):  # bounded: 18 rounds of 1000 removals and 3 x 25 requests
        if time.monotonic() > deadline:
            break
        _cleared(writer, 1000, b"r%02d" % _round)
        for c in readers:
            for _ in range(25):
                got = c.removals_since(0, NS if asked % 2 else None)
                assert len(got.items) <= p.removals_capacity(c.transport.max_payload, 1)
                asked += 1
    head = readers[0].removals_since(0, max_items=0)
    assert head.head > 16384  # past the server's default log size: the oldest were dropped
    behind = readers[0].removals_since(1, NS)
    assert behind.lost == head.head - 16384 - 1 and behind.items  # the oldest kept, and the count lost
    assert mds.rss() - rss0 < 48 * MiB  # the log is bounded (16384 x ~100 B here), requests allocate nothing
    well_behaved_round_trip(mds.tcp, pool, b"after-flood".ljust(32, b"."))
    for c in (writer, *readers):
        c.close()
    pool.close()
