"""Hostile RESERVE_MANY / COMMIT_MANY on both transports: counts that overflow the payload, zero
counts and sizes, duplicate keys and tokens, another client's tokens. Each is refused or answered
per item, changes nothing it should not, and the victim's bytes stay its own."""

from __future__ import annotations

import struct

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import Reservation, connect
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, read_block, until, well_behaved_round_trip, write_block
from tests.support.blocks import zeros_crc

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


def _raw(client, op: int, payload: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side checks) and return the server's code and reply."""
    code, _epoch, reply = client.transport.call(op, client._epoch32, payload, int(5e9))
    return code, reply


def _keys(n: int, tag: bytes) -> list[bytes]:
    return [tag + bytes([i]) + b"." * (31 - len(tag)) for i in range(n)]


@pytest.mark.parametrize("kind", ["cxl", "tcp"])
def test_lying_counts_zero_sizes_and_bad_items_refuse_the_whole_request(mds, kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    c = connect(mds.cxl(1), pool=pool, timeout_s=5) if kind == "cxl" else connect(mds.tcp, timeout_s=5)
    ns = c._ns_id(NS)
    ks = _keys(3, kind.encode())
    good = p.encode_reserve_many(ns, [(k, 4096) for k in ks])
    zero_size = bytearray(good)
    struct.pack_into("<Q", zero_size, 8 + 2 * 40, 0)  # the last item asks for nothing
    attacks = {
        "count overflows the payload": (struct.pack("<IHH", ns, 0xFFFF, 32) + good[8:], Code.BAD_LENGTH),
        "count zero": (struct.pack("<IHH", ns, 0, 32), Code.BAD_LENGTH),
        "key length zero": (struct.pack("<IHH", ns, 3, 0) + b"\0" * 24, Code.BAD_ARGS),
        "key length past the maximum": (struct.pack("<IHH", ns, 1, 256) + b"\1" * 40, Code.BAD_ARGS),
        "a zero-byte item after good ones": (bytes(zero_size), Code.BAD_ARGS),
        "truncated head": (good[:5], Code.BAD_LENGTH),
        "unknown namespace": (p.encode_reserve_many(ns + 1000, [(k, 4096) for k in ks]), Code.UNKNOWN_NS),
    }
    for name, (payload, want) in attacks.items():
        assert _raw(c, Op.RESERVE_MANY, payload)[0] == want, name
    assert c.stats()["reservations"] == 0  # nothing of any refused request was reserved
    # COMMIT_MANY: its own lies; the reservations it names are untouched.
    got = c.reserve_many(NS, [(k, 4096) for k in ks])
    tokens = [r.token for r in got if isinstance(r, Reservation)]
    assert len(tokens) == 3
    batch = p.encode_commit_many([(t, 0, p.COMMIT_MANY_COMMIT) for t in tokens])
    bad_action = bytearray(batch)
    struct.pack_into("<H", bad_action, 8 + 2 * 16 + 14, 9)
    attacks = {
        "count overflows the payload": (struct.pack("<HHI", 0xFFFF, 0, 0) + batch[8:], Code.BAD_LENGTH),
        "count zero": (struct.pack("<HHI", 0, 0, 0), Code.BAD_LENGTH),
        "unknown flags": (struct.pack("<HHI", 3, 4, 0) + batch[8:], Code.BAD_ARGS),
        "unknown action on the last item": (bytes(bad_action), Code.BAD_ARGS),
        "truncated item": (batch[:-3], Code.BAD_LENGTH),
    }
    for name, (payload, want) in attacks.items():
        assert _raw(c, Op.COMMIT_MANY, payload)[0] == want, name
    assert c.lookup_prefix(NS, ks) == 0 and c.stats()["reservations"] == 3
    assert c.commit_many([(t, zeros_crc(4096)) for t in tokens]) == [Code.OK] * 3
    assert c.lookup_prefix(NS, ks) == 3
    well_behaved_round_trip(mds.cxl(4) if kind == "cxl" else mds.tcp, pool, b"after-" + kind.encode() + b"." * 26)
    c.close()
    pool.close()


def test_duplicate_keys_and_tokens_act_once(mds) -> None:
    pool = PoolMapping.open(mds.pool_path)
    c = connect(mds.tcp, timeout_s=5)
    k = b"dup".ljust(32, b".")
    got = c.reserve_many(NS, [(k, 8192)] * 4)
    assert isinstance(got[0], Reservation) and got[1:] == [Code.EXISTS] * 3
    assert c.stats()["reservations"] == 1
    r = got[0]
    write_block(pool, r.extents, content(k, 8192))
    before = c.stats()
    crc = native.crc32c(content(k, 8192))
    assert c.commit_many([(r.token, crc)] * 3) == [Code.OK, Code.NO_RESERVATION, Code.NO_RESERVATION]
    after = c.stats()
    assert after["entries"] == before["entries"] + 1 and after["reservations"] == 0
    loc = c.get(NS, k)
    assert loc is not None and read_block(pool, loc.extents) == content(k, 8192)
    c.release([loc.lease_id])
    c.close()
    pool.close()


@pytest.mark.parametrize("attacker_kind", ["cxl", "tcp"])
def test_another_clients_tokens_in_a_batch_are_refused_one_by_one(mds, attacker_kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    victim = connect(mds.cxl(1), pool=pool, timeout_s=5)
    attacker = connect(mds.cxl(2), pool=pool, timeout_s=5) if attacker_kind == "cxl" else connect(mds.tcp, timeout_s=5)
    n = 32 << 10
    vkeys = _keys(3, b"victim-" + attacker_kind.encode())
    vres = victim.reserve_many(NS, [(k, n) for k in vkeys])
    assert all(isinstance(r, Reservation) for r in vres)
    for k, r in zip(vkeys, vres, strict=True):
        write_block(pool, r.extents, content(k, n // 2))  # half written: a commit now would publish garbage
    akey = b"attacker-" + attacker_kind.encode()
    (mine,) = attacker.reserve_many(NS, [(akey.ljust(32, b"."), 4096)])
    assert isinstance(mine, Reservation)
    commits = [(r.token, 0) for r in vres[:2]] + [(mine.token, zeros_crc(4096))]
    aborts = [vres[2].token]
    assert attacker.finish_many(commits, aborts) == ([Code.NOT_OWNER, Code.NOT_OWNER, Code.OK], [Code.NOT_OWNER])
    assert attacker.lookup_prefix(NS, vkeys) == 0  # nothing of the victim's became visible or was freed
    assert until(lambda: mds.stats()["requests"]["foreign_refused"] >= 3, 2)
    for k, r in zip(vkeys, vres, strict=True):
        write_block(pool, r.extents, content(k, n))
    crcs = [native.crc32c(content(k, n)) for k in vkeys]
    assert victim.commit_many([(r.token, crc) for r, crc in zip(vres, crcs, strict=True)]) == [Code.OK] * 3
    for k, loc in zip(vkeys, victim.get_many(NS, vkeys), strict=True):
        assert loc is not None and read_block(pool, loc.extents) == content(k, n)
        victim.release([loc.lease_id])
    for cl in (victim, attacker):
        cl.close()
    pool.close()
