"""The running server compacts its journal in steps (mds/journal.py JournalKeeper.compact_step): once
half the active half's room is used, the live index is written into the other half a slice of the
index's slab at a time between loop turns, every record appended meanwhile goes to both halves, and
the state word flips after the last slice. At every moment the journal on media replays to exactly
the live index: before the flip from the old half, after it from the new one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from belugactl.dataplane.mds import journal as jm
from belugactl.dataplane.mds.journal import Journal, replay
from belugactl.dataplane.mds.server import MetadataServer
from tests.dataplane.test_journal import start
from tests.support.blocks import zeros_crc


def on_media(server: MetadataServer) -> dict:
    """What a server started now would restore: the journal read back from the pool."""
    g = server.pool.geometry
    live, _order = replay(Journal(server.pool, g.journal_offset, g.journal_size))
    return live


def in_index(server: MetadataServer) -> dict:
    names = server.index.ns_names
    return {
        (names[k[0]], k[1]): (e.alloc.nbytes, [tuple(b) for b in e.alloc.blocks], e.checksum)
        for k, e in server.index.entries.items()
    }


def normal(live: dict) -> dict:
    return {k: (n, [tuple(b) for b in blocks], crc) for k, (n, blocks, crc) in live.items()}


@pytest.mark.parametrize("steps", ["between-turns", "none"])
def test_the_journal_replays_to_the_live_index_at_every_moment_of_a_compaction(
    pool_path: Path, monkeypatch, steps: str
) -> None:
    # "none": no loop turn ever takes a step, so each compaction ends when the old half fills (at once).
    monkeypatch.setattr(jm, "COMPACT_STEP", 16)
    pool, server = start(pool_path)
    keeper = server.keeper
    index = server.index
    ns = [index.open_namespace(f"m/tp{i}") for i in range(3)]
    rng = random.Random(1)
    live: list[tuple[int, bytes]] = []
    seen_mid = checked_mid = 0
    for i in range(30_000):
        if live and (len(live) > 1500 or rng.random() < 0.45):
            n, k = live.pop(rng.randrange(len(live)))
            index.delete(n, k)  # False when the watermark sweep took it (60 kB blocks fill the area)
        else:
            n, k = ns[i % 3], rng.randbytes(32)
            size = rng.choice((4096, 8192, 60_000))
            token, _ = index.reserve(n, k, size)
            index.commit(token, checksum=zeros_crc(size))
            live.append((n, k))
        if steps == "between-turns" and rng.random() < 0.3:
            index.background_step()
        if keeper.compacting:
            seen_mid += 1
            if seen_mid % 500 == 1:  # a crash now: the old half, whole, is what a restart reads
                assert normal(on_media(server)) == in_index(server)
                checked_mid += 1
    assert keeper.journal is not None and not keeper.stopped
    compactions = keeper.journal.compactions
    assert compactions >= 3, compactions
    if steps == "between-turns":
        assert checked_mid >= 3  # compactions ran over many steps, with appends in between
    while index.background:
        index.background_step()
    assert normal(on_media(server)) == in_index(server)
    names = dict(index.ns_names)
    expect = {(names[k[0]], k[1]) for k in index.entries}
    server.close()
    pool.close()
    pool, again = start(pool_path)  # a restart restores exactly the live set
    assert {(again.index.ns_names[k[0]], k[1]) for k in again.index.entries} == expect
    again.close()
    pool.close()


def test_a_compaction_step_is_bounded_and_the_walk_ends(pool_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(jm, "COMPACT_STEP", 64)
    pool, server = start(pool_path)
    keeper, index = server.keeper, server.index
    n = index.open_namespace("m/tp0")
    keys = []
    while not keeper.compacting:  # one block committed and deleted over and over, 500 kept
        k = random.randbytes(32)
        token, _ = index.reserve(n, k, 4096)
        index.commit(token, checksum=zeros_crc(4096))
        keys.append(k)
        if len(keys) > 500:
            index.delete(n, keys.pop(0))
    first = keeper.journal.compactions
    done = [index.background_step() for _ in range(5)]
    assert max(done) <= 64
    while keeper.compacting:
        index.background_step()
    assert keeper.journal.compactions == first + 1
    assert normal(on_media(server)) == in_index(server)
    server.close()
    pool.close()
