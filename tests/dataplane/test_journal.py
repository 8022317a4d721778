"""Restart policy `journal`: committed blocks survive a server restart, nothing else does."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.dataplane.mds.index import IndexConfig
from belugactl.dataplane.mds.journal import HEADER, ORDER, Journal, encode_commit, encode_remove
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc


def start(pool_path: Path, policy: str = "journal", ways: int = 1) -> tuple[PoolMapping, MetadataServer]:
    pool = PoolMapping.open(pool_path)
    index = IndexConfig(interleave_ways=ways) if ways > 1 else IndexConfig()
    server = MetadataServer(
        pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, restart_policy=policy, index=index)
    )
    server.start()
    return pool, server


def put(server: MetadataServer, ns: int, key: bytes, n: int) -> None:
    token, _ = server.index.reserve(ns, key, n)
    server.index.commit(token, checksum=zeros_crc(n))


def test_committed_blocks_survive_a_restart_and_nothing_else(pool_path: Path) -> None:
    pool, a = start(pool_path)
    ns = a.index.open_namespace("m/tp0")
    other = a.index.open_namespace("m/tp1")
    for i in range(20):
        put(a, ns, bytes([i]) * 32, 20_000 + i * 70_000)
    put(a, other, b"o" * 32, 3 << 20)
    a.index.delete(ns, bytes([3]) * 32)
    a.index.reserve(ns, b"half-written".ljust(32), 50_000)  # never committed
    before = {k: (e.alloc.extents, e.alloc.blocks) for k, e in a.index.entries.items()}
    names = dict(a.index.ns_names)
    a.close()  # the process dies; the pool (and its journal) stay
    pool.close()

    pool, b = start(pool_path)
    assert b.epoch == a.epoch + 1 and b.restored_entries == 20
    after = {(names[k[0]], k[1]): (e.alloc.extents, e.alloc.blocks) for k, e in b.index.entries.items()}
    assert after == {(names[k[0]], k[1]): v for k, v in before.items()}
    ns_b = b.index.namespaces["m/tp0"]
    assert b.index.get(ns_b, bytes([3]) * 32) is None
    assert b.index.get(ns_b, b"half-written".ljust(32)) is None
    # The allocator knows what is taken: new blocks never overlap restored ones.
    taken = sorted((o, o + n) for e in b.index.entries.values() for o, n in e.alloc.extents)
    token, fresh = b.index.reserve(ns_b, b"new".ljust(32), 5 << 20)
    for off, n in fresh.extents:
        assert all(off + n <= s or off >= e for s, e in taken)
    assert b.index.alloc.used == sum(e.alloc.footprint for e in b.index.entries.values()) + fresh.footprint
    assert b.snapshot["journal"]["active"] and b.snapshot["restart_policy"] == "journal"
    b.close()
    pool.close()


def test_interleaved_blocks_restore_in_their_byte_order_and_a_changed_interleave_starts_empty(
    pool_path: Path,
) -> None:
    pool, a = start(pool_path, ways=2)
    ns = a.index.open_namespace("m/tp0")
    for i in range(4):
        put(a, ns, bytes([i]) * 32, 5 << 20)  # three granules each: zones alternate within a block
    before = {k: e.alloc.extents for k, e in a.index.entries.items()}
    assert any(ext != sorted(ext) for ext in before.values())  # placement order, not offset order
    a.close()
    pool.close()

    pool, b = start(pool_path, ways=2)  # same interleave: the same extents, in the same order
    assert b.restored_entries == 4 and {k: e.alloc.extents for k, e in b.index.entries.items()} == before
    records = list(Journal(pool, pool.geometry.journal_offset, pool.geometry.journal_size).read())
    assert records[0].kind == ORDER and records[0].blocks == [(2, 2 << 20)]
    b.close()
    pool.close()

    pool, c = start(pool_path)  # interleave turned off: reading by offset would scramble every block
    assert not c.index.entries and c.restored_entries == 0
    assert "interleave 2 ways" in c.journal_note and "started empty" in c.journal_note
    c.close()
    pool.close()


def test_start_empty_ignores_the_journal(pool_path: Path) -> None:
    pool, a = start(pool_path)
    put(a, a.index.open_namespace("n"), b"k" * 32, 4096)
    a.close()
    pool.close()
    pool, b = start(pool_path, "start-empty")
    assert not b.index.entries and b.restored_entries == 0
    b.close()
    pool.close()


def test_torn_tail_is_ignored_and_compaction_keeps_the_live_set(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, HEADER + 2 * 4096)
    j.rewrite([], {})  # an empty journal, generation 1
    blocks = [(4096, g.shared_kv_offset)]
    for i in range(200):  # far more than one 4 KiB half holds: forces compactions
        key = bytes([i % 7]) * 16
        j.append(encode_remove("n", key), live=lambda: [], names={})
        j.append(encode_commit("n", key, 10, blocks), live=lambda: [], names={})
    assert j.compactions > 1
    records = list(Journal(pool, g.journal_offset, HEADER + 2 * 4096).read())
    assert records and records[-1].key == bytes([199 % 7]) * 16
    # A torn write after the last record: replay stops before it.
    base = g.journal_offset + HEADER + j.half * j.half_size
    pool.write(base + j.pos, b"\x40\x00\x00\x00\xde\xad\xbe\xef" + b"\x01" * 64)
    again = list(Journal(pool, g.journal_offset, HEADER + 2 * 4096).read())
    assert [(r.kind, r.key) for r in again] == [(r.kind, r.key) for r in records]
    pool.close()


def test_an_inconsistent_journal_starts_empty(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    j = Journal(pool, g.journal_offset, g.journal_size)
    j.rewrite([], {})
    # Two blocks at the same offset: not something a real server wrote.
    j.append(encode_commit("n", b"a" * 8, 4096, [(4096, g.shared_kv_offset)], zeros_crc(4096)))
    j.append(encode_commit("n", b"b" * 8, 4096, [(4096, g.shared_kv_offset)], zeros_crc(4096)))
    pool.close()
    pool, server = start(pool_path)
    assert not server.index.entries and "inconsistent" in server.journal_note
    server.close()
    pool.close()


@pytest.mark.parametrize("bad", [b"\xff" * 64, b""])
def test_garbage_area_means_no_journal(pool_path: Path, bad: bytes) -> None:
    pool = PoolMapping.open(pool_path)
    if bad:
        pool.write(pool.geometry.journal_offset, bad)
    assert list(Journal(pool, pool.geometry.journal_offset, pool.geometry.journal_size).read()) == []
    pool.close()
