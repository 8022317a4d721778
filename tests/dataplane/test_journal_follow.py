"""A warm standby (mds/journal_follow.py): a server built on the same pool, never started, follows the
leader's journal while the leader commits, deletes, evicts and compacts. At random moments its copy
of the index must equal what a replay of the journal on media gives, block for block; a takeover
then serves that copy and journals on, and a later restart restores exactly it."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.dataplane.mds import journal as jm
from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import IndexConfig
from belugactl.dataplane.mds.journal_follow import JournalFollower
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_journal import start
from tests.dataplane.test_journal_compaction import in_index, normal, on_media
from tests.support.blocks import zeros_crc


def standby(pool_path: Path, ways: int = 1) -> tuple[PoolMapping, MetadataServer, JournalFollower]:
    pool = PoolMapping.open(pool_path)
    index = IndexConfig(interleave_ways=ways) if ways > 1 else IndexConfig()
    server = MetadataServer(
        pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, restart_policy="journal", index=index)
    )
    return pool, server, JournalFollower(server)


@contextmanager
def leader_and_standby(
    pool_path: Path,
) -> Iterator[tuple[PoolMapping, MetadataServer, int, MetadataServer, JournalFollower]]:
    """A started leader with one namespace, and a standby's copy that has taken its first step."""
    pool, leader = start(pool_path)
    ns = leader.index.open_namespace("m/tp0")
    spool, copy, follower = standby(pool_path)
    follower.step()
    try:
        yield pool, leader, ns, copy, follower
    finally:
        leader.close()
        copy.close()
        pool.close()
        spool.close()


def commit(server: MetadataServer, ns: int, key: bytes) -> None:
    token, _ = server.index.reserve(ns, key, 4096)
    server.index.commit(token, checksum=zeros_crc(4096))


def blocks_of(server: MetadataServer) -> dict:
    """Each entry's blocks, and the allocator's accounting: what must agree after a takeover."""
    a = server.allocator
    return {"entries": in_index(server), "used": a.used, "requested": a.requested, "free_chunks": a.free_chunk_count}


def churn(server: MetadataServer, rng: random.Random, ops: int, live: list, ns: list[int]) -> None:
    index = server.index
    for i in range(ops):
        if live and (len(live) > 1200 or rng.random() < 0.45):
            n, k = live.pop(rng.randrange(len(live)))
            index.delete(n, k)  # False when the watermark sweep took it
        else:
            n, k = ns[i % len(ns)], rng.randbytes(32)
            size = rng.choice((4096, 8192, 60_000, 3 << 20))
            token, _ = index.reserve(n, k, size)
            index.commit(token, checksum=zeros_crc(size))
            live.append((n, k))
        if rng.random() < 0.3:
            index.background_step()


@pytest.mark.parametrize("step_budget, ways", [(7, 1), (4096, 1), (64, 2)])
def test_the_standby_copy_equals_the_journal_through_compactions(
    pool_path: Path, monkeypatch, step_budget: int, ways: int
) -> None:
    monkeypatch.setattr(jm, "COMPACT_STEP", 16)
    pool, leader = start(pool_path, ways=ways)
    ns = [leader.index.open_namespace(f"m/tp{i}") for i in range(3)]
    rng = random.Random(step_budget)
    live: list = []
    churn(leader, rng, 500, live, ns)  # a journal before the standby starts: its first sync
    spool, copy, follower = standby(pool_path, ways)
    checked = 0
    for _round in range(150):
        churn(leader, rng, rng.randrange(1, 400), live, ns)
        for _ in range(rng.randrange(1, 4)):
            follower.step(step_budget)
        if rng.random() < 0.4:  # caught up: the copy is what a replay of the media gives
            while follower.step(step_budget):
                pass
            assert not follower.lost, follower.lost
            assert in_index(copy) == normal(on_media(leader))
            checked += 1
    assert leader.keeper.journal.compactions >= 3  # the copy followed through flips of the halves
    assert follower.resyncs >= 3 and checked >= 10
    # The takeover: the leader stops (its writes end); the copy finishes and starts serving.
    while leader.index.background:
        leader.index.background_step()
    expect = blocks_of(leader)
    leader.close()
    pool.close()
    assert follower.finish()
    copy.follower = follower
    copy.start()
    assert copy.keeper.warm and copy.restored_entries == len(expect["entries"])
    assert blocks_of(copy) == expect  # the allocator agrees too: the same space is free
    # It journals on from there; a cold restart afterwards restores exactly its index.
    more: list = []
    churn(copy, rng, 300, more, [copy.index.namespaces[f"m/tp{i}"] for i in range(3)])
    while copy.index.background:
        copy.index.background_step()
    after = blocks_of(copy)
    copy.close()
    spool.close()
    pool, again = start(pool_path, ways=ways)
    assert not again.keeper.warm
    assert blocks_of(again)["entries"] == after["entries"]
    again.close()
    pool.close()


def test_a_record_being_written_is_read_whole_by_a_later_step(pool_path: Path) -> None:
    with leader_and_standby(pool_path) as (pool, leader, ns, copy, follower):
        j = leader.keeper.journal
        at = j.pos
        commit(leader, ns, b"k" * 32)
        whole = bytes(pool.read(j._half_base(j.half) + at, j.pos - at))
        pool.write(j._half_base(j.half) + at + len(whole) - 3, b"\xff\xff\xff")  # torn: its end not yet there
        assert follower.step() == 0 and not follower.lost and not copy.index.entries
        pool.write(j._half_base(j.half) + at, whole)
        assert follower.step() == 1 and len(copy.index.entries) == 1


def test_a_copy_that_disagrees_with_the_journal_is_lost_and_the_takeover_is_cold(pool_path: Path) -> None:
    with leader_and_standby(pool_path) as (_pool, leader, ns, copy, follower):
        copy.allocator.alloc(4096)  # the standby's allocator already holds the space the leader hands out next
        commit(leader, ns, b"k" * 32)
        follower.step()
        assert "disagree" in follower.lost
        assert not follower.finish()


def test_a_stopped_journal_makes_the_copy_lost(pool_path: Path) -> None:
    with leader_and_standby(pool_path) as (_pool, leader, ns, copy, follower):
        commit(leader, ns, b"k" * 32)
        follower.step()
        assert len(copy.index.entries) == 1
        leader.keeper.off("the test stops it")
        follower.step()
        assert "stopped" in follower.lost and "the test stops it" in follower.lost


def test_the_standby_never_writes_the_pool(pool_path: Path) -> None:
    pool, leader = start(pool_path)
    ns = leader.index.open_namespace("m/tp0")
    rng = random.Random(3)
    live: list = []
    churn(leader, rng, 400, live, [ns])
    spool, copy, follower = standby(pool_path)
    before = bytes(pool.buf)
    for _ in range(5):
        follower.step(50)
    churn_free = [e for e in copy.index.entries.values()]
    assert churn_free and bytes(pool.buf) == before  # no zeroing of freed blocks, no header write
    leader.close()
    copy.close()
    pool.close()
    spool.close()


@pytest.mark.parametrize("ways", [1, 3])
def test_take_hands_out_exactly_the_blocks_and_refuses_taken_ones(ways: int) -> None:
    a = Allocator(CHUNK, 64 * CHUNK, ways=ways)
    mirror = Allocator(CHUNK, 64 * CHUNK, ways=ways)
    rng = random.Random(5)
    held = []
    for _ in range(600):
        if held and rng.random() < 0.4:
            x = held.pop(rng.randrange(len(held)))
            a.free(x[0])
            mirror.free(x[1])
            continue
        got = a.alloc(rng.choice((4096, 12_288, 100_000, CHUNK, 2 * CHUNK + 4096)))
        if got is None:
            continue
        held.append((got, mirror.take(got.nbytes, got.blocks)))
        assert held[-1][1].extents == got.extents
    assert (mirror.used, mirror.requested, mirror.free_chunk_count) == (a.used, a.requested, a.free_chunk_count)
    taken = held[0][0].blocks
    with pytest.raises(ValueError):
        mirror.take(4096, taken)  # in use
    with pytest.raises(ValueError):
        mirror.take(4096, [(4096, CHUNK + 100)])  # misaligned
    assert (mirror.used, mirror.free_chunk_count) == (a.used, a.free_chunk_count)  # nothing changed
    # What a take freed comes back to ordinary allocation, and nothing is handed out twice.
    for x in held:
        mirror.free(x[1])
    offs = set()
    while (got := mirror.alloc(4096)) is not None:
        assert got.blocks[0][1] not in offs
        offs.add(got.blocks[0][1])
    assert len(offs) == mirror.chunks * (CHUNK // 4096)


def test_an_append_ends_with_a_zero_length_so_leftovers_of_its_generation_are_not_read(pool_path: Path) -> None:
    # An unfinished rewrite (a leader killed mid-compaction) leaves records of the next generation in
    # the other half; the next leader's rewrite writes that same generation there, shorter. A record
    # it appends must not let a replay run on into those leftovers.
    pool, leader = start(pool_path)
    ns = leader.index.open_namespace("m/tp0")
    j = leader.keeper.journal
    body = jm.encode_commit("m/tp0", b"s" * 32, 4096, [(4096, j.offset)], 7)
    stale = jm._REC.pack(len(body), jm._crc(j.generation, body)) + body
    # The next append is as long as `stale`: the leftover starts exactly where that record ends.
    pool.write(j._half_base(j.half) + j.pos + len(stale), stale)
    token, _ = leader.index.reserve(ns, b"k" * 32, 4096)
    leader.index.commit(token, checksum=zeros_crc(4096))
    live = on_media(leader)
    assert ("m/tp0", b"k" * 32) in live and ("m/tp0", b"s" * 32) not in live
    leader.close()
    pool.close()


def test_a_lost_copy_is_dropped_and_a_fresh_one_follows_once_the_journal_is_back(pool_path: Path, monkeypatch) -> None:
    import time

    from belugactl.dataplane.mds import standby as sb

    monkeypatch.setattr(sb, "RETRY_S", 0.05)
    pool, leader = start(pool_path)
    ns = leader.index.open_namespace("m/tp0")
    commit(leader, ns, b"a" * 32)
    warm: list[dict] = []
    copy = sb.WarmCopy(lambda: standby(pool_path)[1], 0.01, warm.append)

    def wait(cond, what: str) -> None:  # noqa: ANN001
        end = time.monotonic() + 20
        while not cond():
            assert time.monotonic() < end, (what, copy.stats())
            time.sleep(0.01)

    try:
        wait(lambda: copy.stats().get("entries") == 1 and copy.stats()["warm"], "the first copy")
        leader.keeper.off("the test stops it")  # the journal stops: this copy can no longer be trusted
        wait(lambda: copy.dropped >= 1, "the copy dropped")
        assert "the test stops it" in copy.error
        leader.close()
        pool.close()
        pool, leader = start(pool_path)  # a new leader: starts empty (the journal had stopped), journals again
        commit(leader, leader.index.open_namespace("m/tp0"), b"b" * 32)
        wait(lambda: copy.stats().get("entries") == 1 and copy.stats()["warm"], "a fresh copy")
        assert len(warm) >= 2
        server = copy.take()
        assert server is not None and [k for _n, k in server.index.entries] == [b"b" * 32]
        server.close()
        server.pool.close()
    finally:
        copy.discard()
        leader.close()
        pool.close()


def test_a_resync_builds_the_copy_with_the_cyclic_gc_paused_and_freezes_it(pool_path: Path, monkeypatch) -> None:
    seen: list[bool] = []

    def watch(name: str) -> None:
        real = getattr(jm, name)

        def watched(journal: jm.Journal) -> object:
            seen.append(gc.isenabled())
            return real(journal)

        monkeypatch.setattr(f"belugactl.dataplane.mds.journal_follow.{name}", watched)

    watch("replay")  # a later resync
    watch("replay_live")  # the first one
    with leader_and_standby(pool_path) as (_pool, leader, ns, copy, follower):
        for i in range(20):
            commit(leader, ns, i.to_bytes(32, "little"))
        frozen = gc.get_freeze_count()
        follower.followed = None  # the next step parses the whole half again
        assert follower.step() >= 1 and len(copy.index.entries) == 20
        assert seen and seen[-1] is False, "the resync ran with the cyclic GC on"
        assert gc.isenabled() and gc.get_freeze_count() > frozen


def test_gc_paused_restores_the_gc_after_an_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), jm.gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failed rebuild")
    assert gc.isenabled()
