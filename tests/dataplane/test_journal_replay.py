"""The bulk replay (journal.replay over Journal.scan) and the packed compaction (Journal.rewrite) mean
exactly what the record-at-a-time reader and encoder mean, on coherent and non-coherent pools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from belugactl.dataplane.mds import journal as jm
from belugactl.dataplane.mds.allocator import Allocation
from belugactl.dataplane.mds.journal import COMMIT, ORDER, REMOVE, Journal, encode_commit, encode_remove, replay
from belugactl.pool.mapping import PoolMapping


def _alloc(nbytes: int, blocks: list[tuple[int, int]]) -> Allocation:
    """The allocator's own record: one block in its compact form, several in lists."""
    if len(blocks) == 1:
        size, off = blocks[0]
        return Allocation([(off, min(size, nbytes))], blocks, nbytes)
    return Allocation([(off, size) for size, off in blocks], blocks, nbytes)


@dataclass
class _Entry:
    key: tuple[int, bytes]
    alloc: Allocation
    checksum: int | None


def _entries(base: int, n: int) -> list[_Entry]:
    out = []
    for i in range(n):
        blocks = [(4096, base + i * 4096)] if i % 3 else [(2 << 20, base + (1 << 30) + i * (4 << 20)), (4096, base + 7)]
        out.append(_Entry((i % 2, i.to_bytes(4, "little") * 8), _alloc(4000 + i, blocks), None if i == 5 else i))
    return out


def _old_live(j: Journal) -> dict:
    live = {}
    for rec in j.read():
        if rec.kind == COMMIT:
            live[(rec.ns, rec.key)] = (rec.nbytes, [(int(s), int(o)) for s, o in rec.blocks or []], rec.checksum)
        elif rec.kind == REMOVE:
            live.pop((rec.ns, rec.key), None)
    return live


@pytest.mark.parametrize("flush", [False, True], ids=["coherent", "flush"])
def test_rewrite_then_replay_gives_back_every_entry(pool_path: Path, monkeypatch, flush: bool) -> None:
    monkeypatch.setattr(jm, "REWRITE_CHUNK", 512)  # many chunks
    monkeypatch.setattr(jm, "SCAN_FLUSH", 256)  # many invalidations
    pool = PoolMapping.open(pool_path)
    monkeypatch.setattr(pool, "needs_flush", flush)
    g = pool.geometry
    names = {0: "m/tp0", 1: "other@abc@tp1of2"}
    entries = _entries(g.shared_kv_offset, 300)
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.order = (4, 2 << 20)
    j.rewrite(entries, names)
    # appends after a rewrite land where the old encoder would put them
    j.append(encode_remove("m/tp0", entries[2].key[1]))
    j.append(encode_commit("m/tp0", b"late", 9, [(4096, g.shared_kv_offset)], 1))
    kept = [e for e in entries if e is not entries[2]]
    expect = {(names[e.key[0]], e.key[1]): (e.alloc.nbytes, e.alloc.blocks, e.checksum) for e in kept}
    expect[("m/tp0", b"late")] = (9, [(4096, g.shared_kv_offset)], 1)
    reader = Journal(pool, g.journal_offset, g.journal_size)
    assert _old_live(reader) == expect
    live, order = replay(Journal(pool, g.journal_offset, g.journal_size))
    assert live == expect and order == (4, 2 << 20)
    kinds = [r.kind for r in Journal(pool, g.journal_offset, g.journal_size).read()]
    assert kinds[0] == ORDER and len(kinds) == 1 + 300 + 2
    pool.close()


def test_replay_stops_where_read_stops(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.rewrite(_entries(g.shared_kv_offset, 10), {0: "a", 1: "b"})
    # A record whose crc matches but whose body does not parse (an unknown kind), then a good one.
    bad = bytes([9]) + b"\0" * 12
    j.append(bad)
    j.append(encode_commit("a", b"after", 1, [(4096, g.shared_kv_offset)], 1))
    live, _ = replay(Journal(pool, g.journal_offset, g.journal_size))
    assert live == _old_live(Journal(pool, g.journal_offset, g.journal_size))
    assert ("a", b"after") not in live and len(live) == 10
    # A torn tail: neither reader goes past it.
    j2 = Journal(pool, g.journal_offset, g.journal_size)
    j2.rewrite(_entries(g.shared_kv_offset, 10), {0: "a", 1: "b"})
    pool.write(g.journal_offset + jm.HEADER + j2.half * j2.half_size + j2.pos, b"\x40\0\0\0\xde\xad\xbe\xef")
    assert replay(Journal(pool, g.journal_offset, g.journal_size))[0] == _old_live(
        Journal(pool, g.journal_offset, g.journal_size)
    )
    pool.close()


def test_a_rewrite_that_does_not_fit_raises_and_keeps_the_old_half(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, jm.HEADER + 2 * 4096)
    j.rewrite(_entries(g.shared_kv_offset, 3), {0: "a", 1: "b"})
    before = replay(Journal(pool, g.journal_offset, jm.HEADER + 2 * 4096))[0]
    with pytest.raises(jm.JournalFull):
        j.rewrite(_entries(g.shared_kv_offset, 200), {0: "a", 1: "b"})
    assert replay(Journal(pool, g.journal_offset, jm.HEADER + 2 * 4096))[0] == before
    pool.close()
