"""The native replay and the start-up copy (_native_journal.c) mean exactly what the Python replay and
rewrite mean: on random halves with every kind of record, on hostile records (crc-valid bytes that do
not parse, names that are not UTF-8, torn tails), and at a whole server restart."""

from __future__ import annotations

import random
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds import journal as jm
from belugactl.dataplane.mds.allocator import PackedShapes
from belugactl.dataplane.mds.index import IndexConfig
from belugactl.dataplane.mds.journal import Journal, encode_commit, encode_order, encode_remove, replay_live
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

pytestmark = pytest.mark.skipif(native.journal_replay is None, reason="the native helper is not built")

NAMES = ["m/tp0", "m/tp1", "ténant@é/tp0", ""]


def _items(live: jm.LiveSet) -> list[tuple[str, bytes, int, list[tuple[int, int]], int]]:
    return [
        (live.names[i], key, nbytes, [tuple(b) for b in blocks], crc)
        for i, key, (nbytes, blocks), crc in zip(live.ns_ids, live.keys, live.shapes, live.checksums, strict=True)
    ]


def _both(pool: PoolMapping, g, monkeypatch, fell_back: bool = False) -> tuple[jm.LiveSet, int, jm.LiveSet, int]:
    fast_j = Journal(pool, g.journal_offset, g.journal_size)
    fast = replay_live(fast_j)
    with monkeypatch.context() as m:
        m.setattr(native, "journal_replay", None)
        slow_j = Journal(pool, g.journal_offset, g.journal_size)
        slow = replay_live(slow_j)
    assert slow.spans is None and (fast.spans is None) == fell_back  # the two paths did run
    # The native replay's blocks come packed (the allocator restores their whole chunks in C).
    assert isinstance(fast.shapes, PackedShapes) != fell_back and isinstance(slow.shapes, list)
    return fast, fast_j.pos, slow, slow_j.pos


_GOOD = encode_commit("m/tp0", b"k" * 32, 4096, [(4096, 1 << 30)], 7)
# Bodies whose crc will match but which do not parse: a replay must end at each.
BAD_BODIES = {
    "unknown kind": bytes([9]) + b"\0" * 12,
    "no name length": b"\x01",
    "name past the end": b"\x01\x05\x00ab",
    "key cut short": _GOOD[:20],
    "blocks cut short": _GOOD[: len(_GOOD) - 6 - 16 - 1],
    "unknown checksum kind": _GOOD[:-6] + struct.pack("<HI", 2, 7),
    "ORDER without ways": encode_order(0, 2 << 20),
    "ORDER cut short": encode_order(1, 2 << 20)[:16],
    "REMOVE key cut short": bytes([2]) + struct.pack("<H", 1) + b"a" + struct.pack("<H", 9) + b"short",
}


def _empty_journal(pool_path: Path) -> tuple[PoolMapping, object, Journal]:
    """The pool's journal, started empty (a new generation, nothing in its half)."""
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.rewrite([], {})
    return pool, g, j


def _fill(j: Journal, rng: random.Random, base: int, n: int) -> None:
    keys: list[tuple[str, bytes]] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.05:
            j.append(encode_order(rng.choice([1, 2, 4]), rng.choice([2 << 20, 4 << 20])))
        elif r < 0.25 and keys:
            ns, key = rng.choice(keys) if rng.random() < 0.8 else ("m/tp0", b"never")
            j.append(encode_remove(ns, key))
        else:
            if keys and rng.random() < 0.3:
                ns, key = rng.choice(keys)  # a later commit of the same key wins
            else:
                ns, key = rng.choice(NAMES), rng.randbytes(rng.choice([0, 1, 16, 31, 32, 33, 64, 70]))
                keys.append((ns, key))
            blocks = [
                (rng.choice([4096, 65536, 2 << 20]), base + rng.randrange(1 << 20) * 4096)
                for _ in range(rng.choice([1, 1, 1, 2, 3]))
            ]
            crc = None if rng.random() < 0.1 else rng.getrandbits(32)
            body = encode_commit(ns, key, rng.randrange(1, 1 << 22), blocks, crc)
            if crc is not None and rng.random() < 0.05:
                body += b"\xaa" * rng.randrange(1, 9)  # bytes after the trailer: ignored by both
            j.append(body)


@pytest.mark.parametrize("flush", [False, True], ids=["coherent", "flush"])
@pytest.mark.parametrize("seed", range(12))
def test_the_native_replay_is_the_python_replay_on_random_and_hostile_halves(
    pool_path: Path, monkeypatch, seed: int, flush: bool
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(jm, "SCAN_FLUSH", 256)  # many invalidations on the way
    pool = PoolMapping.open(pool_path)
    monkeypatch.setattr(pool, "needs_flush", flush)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.order = (1, 2 << 20)
    j.rewrite([], {})
    _fill(j, rng, g.shared_kv_offset, rng.randrange(50, 400))
    end = seed % 4
    if end == 1:
        j.append(rng.choice(list(BAD_BODIES.values())))  # crc-valid, does not parse
        j.append(encode_commit("m/tp0", b"after the bad one", 1, [(4096, g.shared_kv_offset)], 1))
    elif end == 2:  # a torn tail: a length and a crc that do not match what follows
        pool.write(j._half_base(j.half) + j.pos, struct.pack("<II", 40, 0xDEADBEEF) + b"\x01" * 40)
    elif end == 3:  # a length past the half's end
        pool.write(j._half_base(j.half) + j.pos, struct.pack("<II", j.half_size, 0))
    fast, fast_pos, slow, slow_pos = _both(pool, g, monkeypatch)
    assert _items(fast) == _items(slow)
    assert (fast.order, fast.unchecked, fast_pos) == (slow.order, slow.unchecked, slow_pos)
    assert len(_items(fast)) > 0
    if end == 1:
        assert ("m/tp0", b"after the bad one") not in {(n, k) for n, k, *_ in _items(fast)}
    pool.close()


@pytest.mark.parametrize("flush", [False, True], ids=["coherent", "flush"])
def test_keys_merge_the_same_across_the_merge_tables_growths(pool_path: Path, monkeypatch, flush: bool) -> None:
    # Enough keys for the native merge table to grow several times (it starts at 4,096 slots), then
    # later commits and removals of keys from before each growth: each must find its first record.
    pool = PoolMapping.open(pool_path)
    monkeypatch.setattr(pool, "needs_flush", flush)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.rewrite([], {})
    at = lambda i: [(4096, g.shared_kv_offset + (i % (1 << 18)) * 4096)]  # noqa: E731
    for i in range(9000):
        j.append(encode_commit(NAMES[i % 2], key := i.to_bytes(4, "little") * 8, 100 + i, at(i), i))
        if i % 5 == 4:
            old = i // 3
            if old % 2:
                j.append(encode_commit(NAMES[old % 2], old.to_bytes(4, "little") * 8, 7, at(old + 1), 1_000_000 + i))
            else:
                j.append(encode_remove(NAMES[old % 2], old.to_bytes(4, "little") * 8))
    del key
    fast, fast_pos, slow, slow_pos = _both(pool, g, monkeypatch)
    assert _items(fast) == _items(slow) and fast_pos == slow_pos
    got = {k: (nbytes, crc) for _, k, nbytes, _, crc in _items(fast)}
    assert 5000 < len(got) < 9000 and got[(1).to_bytes(4, "little") * 8][0] == 7  # re-committed: the last wins
    pool.close()


def test_a_block_of_size_zero_reads_back_as_itself_and_no_restore_takes_it(pool_path: Path, monkeypatch) -> None:
    # A crc-valid COMMIT whose one block has size 0 parses (both replays keep it); packed, it must not
    # pass for "see the block lists" (size 0 there), nor name another record's list.
    from belugactl.dataplane.mds.allocator import Allocator

    pool, g, j = _empty_journal(pool_path)
    j.append(encode_commit("m/tp0", b"a" * 32, 10, [], 1))  # no blocks: multi's list 0
    j.append(encode_commit("m/tp0", b"b" * 32, 10, [(0, 0)], 2))  # size 0 at offset 0
    j.append(encode_commit("m/tp0", b"c" * 32, 10, [(0, 1 << 40)], 3))  # size 0 far out
    fast, fast_pos, slow, slow_pos = _both(pool, g, monkeypatch)
    assert _items(fast) == _items(slow) and fast_pos == slow_pos
    assert [blocks for *_, blocks, _ in _items(fast)] == [[], [(0, 0)], [(0, 1 << 40)]]
    for live in (fast, slow):
        with pytest.raises(ValueError):
            Allocator(g.shared_kv_offset, 64 << 20).restore(live.shapes)
    pool.close()


@pytest.mark.parametrize("bad", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_a_record_that_does_not_parse_ends_both_replays_at_it(pool_path: Path, monkeypatch, bad: bytes) -> None:
    pool, g, j = _empty_journal(pool_path)
    j.append(encode_commit("m/tp0", b"a" * 32, 10, [(4096, g.shared_kv_offset)], 1))
    at = j.pos
    j.append(bad)
    j.append(encode_commit("m/tp0", b"c" * 32, 10, [(4096, g.shared_kv_offset + 8192)], 1))
    fast, fast_pos, slow, slow_pos = _both(pool, g, monkeypatch)
    assert _items(fast) == _items(slow) == [("m/tp0", b"a" * 32, 10, [(4096, g.shared_kv_offset)], 1)]
    assert fast_pos == slow_pos == at
    pool.close()


def test_a_name_that_is_not_utf8_ends_the_replay_where_python_ends_it(pool_path: Path, monkeypatch) -> None:
    pool, g, j = _empty_journal(pool_path)
    j.append(encode_commit("m/tp0", b"a" * 32, 10, [(4096, g.shared_kv_offset)], 1))
    raw = b"\xff\xfe"  # crc-valid, but no str
    j.append(
        bytes([jm.COMMIT])
        + struct.pack("<H", 2)
        + raw
        + encode_commit("x", b"b" * 32, 10, [(4096, g.shared_kv_offset + 4096)], 1)[4:]
    )
    j.append(encode_commit("m/tp0", b"c" * 32, 10, [(4096, g.shared_kv_offset + 8192)], 1))
    fast, fast_pos, slow, slow_pos = _both(pool, g, monkeypatch, fell_back=True)
    assert _items(fast) == _items(slow) == [("m/tp0", b"a" * 32, 10, [(4096, g.shared_kv_offset)], 1)]
    assert fast_pos == slow_pos
    pool.close()


def test_journal_copy_checks_its_spans_its_room_and_the_halves(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    src, dst, half = j._half_base(0), j._half_base(1), j.half_size
    body = encode_commit("m/tp0", b"k" * 32, 9, [(4096, g.shared_kv_offset)], 5)
    pool.write(src + 100, body)
    spans = struct.pack("<QQ", 100, len(body))
    seed = zlib.crc32(struct.pack("<Q", 7))
    assert native.journal_copy(pool.buf, src, half, spans, dst, half, seed, False) == 8 + len(body)
    length, crc = struct.unpack_from("<II", pool.read(dst, 8))
    assert length == len(body) and crc == zlib.crc32(body, seed) and pool.read(dst + 8, len(body)) == body
    assert native.journal_copy(pool.buf, src, half, spans, dst, 8 + len(body) - 1, seed, False) == -1  # no room
    for bad in (
        struct.pack("<QQ", half - 4, 8),
        struct.pack("<QQ", 0, 0),
        struct.pack("<QQ", 1 << 63, 1 << 63),
        b"\0" * 15,
    ):
        with pytest.raises(ValueError):
            native.journal_copy(pool.buf, src, half, bad, dst, half, seed, False)
    with pytest.raises(ValueError, match="overlaps"):
        native.journal_copy(pool.buf, src, half, spans, src + half - 16, half, seed, False)
    with pytest.raises(ValueError):  # a destination outside the buffer
        native.journal_copy(pool.buf, src, half, spans, len(pool.buf) - 4, half, seed, False)
    pool.close()


def test_journal_copy_uses_the_spans_it_checked_even_where_the_copy_overwrites_them() -> None:
    # The spans lie in the destination, and body 0's bytes, copied, turn span 1 into one far
    # outside the buffer: what was checked must be what is used (an out-of-bounds read otherwise).
    buf = bytearray(8192)
    src, dst = 0, 4096
    buf[16:32] = struct.pack("<QQ", 1 << 40, 64)
    buf[dst + 8 : dst + 40] = struct.pack("<QQQQ", 0, 64, 0, 64)  # both valid when checked
    body = bytes(buf[0:64])
    assert native.journal_copy(buf, src, 4096, memoryview(buf)[dst + 8 : dst + 40], dst, 4096, 0, False) == 144
    assert buf[dst + 8 : dst + 72] == body and buf[dst + 80 : dst + 144] == body


def _index_of(server: MetadataServer) -> dict:
    names = server.index.ns_names
    return {(names[k[0]], k[1]): (e.alloc.nbytes, e.alloc.blocks, e.checksum) for k, e in server.index.entries.items()}


def _start(pool_path: Path) -> tuple[PoolMapping, MetadataServer]:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(
        pool,
        ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, restart_policy="journal", index=IndexConfig()),
    )
    server.start()
    return pool, server


def test_a_restart_copies_the_live_records_to_the_bytes_the_python_rewrite_writes(
    pool_path: Path, tmp_path: Path, monkeypatch
) -> None:
    pool, a = _start(pool_path)
    rng = random.Random(5)
    names = [a.index.open_namespace(n) for n in ("m/tp0", "m/tp1", "ténant@é/tp0")]
    keys = []
    for i in range(400):
        ns, key = rng.choice(names), rng.randbytes(32)
        if keys and rng.random() < 0.3:
            ns, key = rng.choice(keys)
            a.index.delete(ns, key)
        n = 3 << 20 if i % 100 == 7 else rng.choice([4096, 9000, 70_000])  # a few of several chunks
        tok, _ = a.index.reserve(ns, key, n)
        a.index.commit(tok, checksum=zeros_crc(n))
        keys.append((ns, key))
        if i % 50 == 0:
            a.index.delete(*rng.choice(keys))
    want = _index_of(a)
    a.close()
    pool.close()
    shutil.copyfile(pool_path, tmp_path / "copy.bin")

    copies = []
    real = Journal.rewrite_copy
    monkeypatch.setattr(Journal, "rewrite_copy", lambda self, *x: (copies.append(1), real(self, *x)))
    results = []
    for path, native_replay in ((pool_path, native.journal_replay), (tmp_path / "copy.bin", None)):
        with monkeypatch.context() as m:
            m.setattr(native, "journal_replay", native_replay)
            pool, b = _start(path)
        j = b.keeper.journal
        results.append((_index_of(b), j.state(), pool.read(j._half_base(j.half), j.pos), b.keeper.restored_entries))
        b.close()
        pool.close()
    assert copies == [1]  # the first start copied, the second rewrote from its index
    (fast, fstate, fbytes, fn), (slow, sstate, sbytes, sn) = results
    assert fast == slow == want and fn == sn == len(want) > 200
    assert fstate == sstate and fbytes == sbytes  # the same half, byte for byte
    pool, c = _start(pool_path)  # and the copied half restores the same index again
    assert _index_of(c) == want
    c.close()
    pool.close()
