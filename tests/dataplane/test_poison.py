"""Poisoned lines (mds/poison.py): the allocator's quarantine, the index's incremental drop, the
ranges' parsing (hostile bodies), and POST /poison on an in-process server's admin port."""

from __future__ import annotations

import http.client
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from belugactl.dataplane.mds.allocator import CHUNK, MIN_BLOCK, Allocator
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.poison import (
    MAX_BODY,
    MAX_RANGES_PER_POST,
    PoisonRequestError,
    PoisonWatch,
    RangeSet,
    parse_ranges,
)
from belugactl.dataplane.mds.removal_log import WHY_DELETED

BASE = 4 * CHUNK
LINE = 64


# --- the allocator's quarantine -------------------------------------------------------------------
def _all_chunks(a: Allocator) -> list[int]:
    got = []
    while (x := a.alloc(CHUNK)) is not None:
        got.append(x.blocks[0][1])
    return got


def test_a_fresh_chunk_quarantined_is_never_handed_out() -> None:
    a = Allocator(BASE, 8 * CHUNK)
    new, in_use = a.quarantine(BASE + 3 * CHUNK + 4096, LINE)
    assert new == [BASE + 3 * CHUNK] and in_use == []
    assert a.free_chunk_count == 7
    chunks = _all_chunks(a)
    assert len(chunks) == 7 and BASE + 3 * CHUNK not in chunks
    assert a.free_chunk_count == 0 and a.alloc(MIN_BLOCK) is None
    assert a.stats()["quarantined_bytes"] == CHUNK


def test_a_freed_chunk_on_the_stack_quarantined_is_skipped() -> None:
    a = Allocator(BASE, 4 * CHUNK)
    held = [a.alloc(CHUNK) for _ in range(4)]
    for x in held:
        assert x is not None
        a.free(x)  # all four on the free stack now
    new, in_use = a.quarantine(BASE + CHUNK, 1)
    assert new == [BASE + CHUNK] and in_use == []
    assert a.free_chunk_count == 3
    assert sorted(_all_chunks(a)) == [BASE, BASE + 2 * CHUNK, BASE + 3 * CHUNK]


def test_a_range_is_rounded_out_to_every_chunk_it_touches() -> None:
    a = Allocator(BASE, 8 * CHUNK)
    new, _ = a.quarantine(BASE + 2 * CHUNK - LINE, 2 * LINE)  # one line each side of a boundary
    assert new == [BASE + CHUNK, BASE + 2 * CHUNK]
    again, _ = a.quarantine(BASE + CHUNK, CHUNK)  # already quarantined: nothing new
    assert again == []
    assert a.quarantine(0, BASE) == ([], [])  # before the area: not the allocator's
    assert a.quarantine(BASE + 8 * CHUNK, CHUNK) == ([], [])  # past it


def test_a_carved_chunk_in_use_gives_no_more_blocks_and_keeps_its_freed_ones() -> None:
    a = Allocator(BASE, 2 * CHUNK)
    small = [a.alloc(64 << 10) for _ in range(4)]  # four blocks of one carved chunk
    assert all(s is not None for s in small)
    chunk = small[0].blocks[0][1]  # type: ignore[union-attr]
    new, in_use = a.quarantine(chunk + 100, LINE)
    assert new == in_use == [chunk]
    later = [a.alloc(64 << 10) for _ in range(8)]
    assert all(x is not None and x.blocks[0][1] >= chunk + CHUNK for x in later)  # from the other chunk
    for s in small:
        a.free(s)  # type: ignore[arg-type]
    assert a.stats()["classes"][str(64 << 10)]["chunks"] == 1  # only the healthy chunk counts as carved
    for x in later:
        a.free(x)  # type: ignore[arg-type]
    assert a.used == 0 and a.free_chunk_count == 1
    assert _all_chunks(a) == [chunk + CHUNK]


def test_a_whole_chunk_in_use_is_not_given_back_when_freed() -> None:
    a = Allocator(BASE, 3 * CHUNK)
    big = a.alloc(2 * CHUNK)
    assert big is not None
    _new, in_use = a.quarantine(BASE + CHUNK, LINE)
    assert in_use == [BASE + CHUNK]
    a.free(big)
    assert a.free_chunk_count == 2 and a.used == 0
    assert sorted(_all_chunks(a)) == [BASE, BASE + 2 * CHUNK]
    assert not a.can_ever_fit(3 * CHUNK) and a.can_ever_fit(2 * CHUNK)


def test_churn_with_quarantines_never_places_a_new_block_on_a_quarantined_chunk() -> None:
    rng = random.Random(3)
    a = Allocator(BASE, 24 * CHUNK)
    live: list = []
    for step in range(3000):
        if step % 300 == 150:
            a.quarantine(BASE + rng.randrange(24 * CHUNK), LINE)
        if live and rng.random() < 0.5:
            a.free(live.pop(rng.randrange(len(live))))
            continue
        before = set(a.quarantined)
        got = a.alloc(rng.choice([4096, 20_000, 160 << 10, CHUNK + 12345, 700_000]))
        if got is not None:
            assert not any(off - (off - BASE) % CHUNK in before for _s, off in got.blocks)
            live.append(got)
        # The free count stays exact: exactly that many whole chunks can be taken.
    for x in live:
        a.free(x)
    n = a.free_chunk_count
    assert len(_all_chunks(a)) == n == 24 - len(a.quarantined)


# --- ranges -----------------------------------------------------------------------------------------
def test_range_set_merges_and_says_what_is_new() -> None:
    r = RangeSet()
    assert r.add(100, 200) == [(100, 200)]
    assert r.add(150, 300) == [(200, 300)]
    assert r.add(0, 50) == [(0, 50)]
    assert r.add(40, 400) == [(50, 100), (300, 400)]
    assert list(r) == [(0, 400)] and r.bytes == 400
    assert r.add(10, 20) == []
    assert r.overlaps(399, 500) and not r.overlaps(400, 500)
    assert r.hits([(1000, 10), (390, 20)]) and not r.hits([(400, 4096)])


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"{", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'{"ranges": 5}', "expected"),
        (b'{"ranges": [5]}', "not an object"),
        (b'{"ranges": [{"offset": true, "length": 64}]}', "offset is not an integer"),
        (b'{"ranges": [{"offset": 1.5, "length": 64}]}', "offset is not an integer"),
        (b'{"ranges": [{"offset": "0x10", "length": 64}]}', "offset is not an integer"),
        (b'{"ranges": [{"offset": 0}]}', "length is not an integer"),
        (b'{"ranges": [{"offset": -64, "length": 64}]}', "need offset >= 0"),
        (b'{"ranges": [{"offset": 0, "length": 0}]}', "need offset >= 0"),
        (b'{"ranges": [{"offset": 4096, "length": 1e400}]}', "length is not an integer"),
        (b'{"ranges": [{"offset": 1048512, "length": 128}]}', "past the pool"),
        (json.dumps({"ranges": [{"offset": 0, "length": 64}] * (MAX_RANGES_PER_POST + 1)}).encode(), "over"),
        (b" " * (MAX_BODY + 1), "over"),
    ],
)
def test_hostile_bodies_are_refused_whole(body: bytes, why: str) -> None:
    with pytest.raises(PoisonRequestError, match=why):
        parse_ranges(body, 1 << 20)


def test_doctor_details_and_a_bare_list_are_taken() -> None:
    details = {"poisoned_pool_ranges": [{"offset": 4096, "length": 64, "source": "Injected", "area": "kv"}]}
    assert parse_ranges(json.dumps(details).encode(), 1 << 20) == [(4096, 64)]
    assert parse_ranges(b'[{"offset": 0, "length": 1}]', 1 << 20) == [(0, 1)]
    checks = [{"id": "cxl.memdev-health", "details": {}}, {"id": "cxl.media-errors", "details": details}]
    report = {"schema_version": 1, "checks": checks}
    assert parse_ranges(json.dumps(report).encode(), 1 << 20) == [(4096, 64)]  # doctor --json | POST
    clean = {"checks": [{"id": "cxl.media-errors", "status": "skip", "details": {}}]}
    assert parse_ranges(json.dumps(clean).encode(), 1 << 20) == []
    assert parse_ranges(json.dumps({"checks": []}).encode(), 1 << 20) == []


# --- the index: dropped incrementally -------------------------------------------------------------
def _geometry(kv_offset: int, kv_size: int) -> SimpleNamespace:
    return SimpleNamespace(
        pool_size=kv_offset + kv_size, rpc_offset=2 << 20, ring_count=2, ring_stride=1 << 20,
        journal_offset=4 << 20, journal_size=1 << 20, shared_kv_offset=kv_offset, shared_kv_size=kv_size,
    )  # fmt: skip


def _index(chunks: int = 4, **cfg) -> tuple[KVIndex, PoisonWatch, int, list[str]]:
    idx = KVIndex(Allocator(BASE, chunks * CHUNK), IndexConfig(**cfg))
    logged: list[str] = []
    return idx, PoisonWatch(idx, _geometry(BASE, chunks * CHUNK), log=logged.append), idx.open_namespace("m"), logged


def _key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def _put(idx: KVIndex, ns: int, i: int, n: int) -> None:
    token, _ = idx.reserve(ns, _key(i), n)
    idx.commit(token)


def test_blocks_on_a_poisoned_line_are_dropped_a_bounded_slice_per_step() -> None:
    idx, watch, ns, _ = _index()
    for i in range(200):
        _put(idx, ns, i, 16 << 10)  # 128 per chunk: two chunks in use
    victim = idx.entries[(ns, _key(130))]
    off = victim.alloc.extents[0][0]
    assert watch.submit([(off + 4096, LINE)], "test") == 1
    assert (ns, _key(130)) in idx.entries  # queued only: the loop applies it
    checked = []
    while watch.busy:
        checked.append(watch.step(budget=16))
    assert max(checked) <= 16 and sum(checked) == 200  # every entry checked once, 16 a step
    assert idx.get(ns, _key(130)) is None and (ns, _key(130)) not in idx.entries
    assert len(idx.entries) == 199  # the other blocks of the chunk stay served
    recs = list(idx.removals.records(1, idx.removals.head))
    assert [(r.key, r.why) for r in recs] == [(_key(130), WHY_DELETED)]  # the connector's KV event
    s = watch.stats()
    assert s["blocks_dropped"] == 1 and s["chunks_quarantined"] == 1 and s["ranges_known"] == 1
    # The quarantined chunk hands out nothing more, even once everything else is freed.
    chunk = off - (off - BASE) % CHUNK
    for i in range(200):
        idx.delete(ns, _key(i))
    assert idx.alloc.used == 0
    got = [idx.alloc.alloc(16 << 10) for _ in range(3 * 128)]
    assert all(g is not None and not chunk <= g.blocks[0][1] < chunk + CHUNK for g in got)
    assert idx.alloc.alloc(16 << 10) is None


def test_a_poisoned_free_chunk_needs_no_scan() -> None:
    idx, watch, ns, _ = _index()
    _put(idx, ns, 1, 16 << 10)
    watch.submit([(BASE + 3 * CHUNK, LINE)], "test")
    watch.step()
    assert watch.stats()["scans"] == 0 and not watch.busy and len(idx.entries) == 1


def test_a_leased_block_leaves_the_lookups_at_once_and_its_space_waits_for_the_lease() -> None:
    idx, watch, ns, _ = _index()
    _put(idx, ns, 1, CHUNK + 4096)  # a chunk and a tail block elsewhere
    e = idx.entries[(ns, _key(1))]
    got = idx.get(ns, _key(1))
    assert got is not None
    lease = got[1]
    used = idx.alloc.used
    watch.submit([(e.alloc.extents[0][0], LINE)], "test")
    while watch.busy:
        watch.step()
    assert idx.get(ns, _key(1)) is None  # the next lookup misses
    assert idx.alloc.used == used  # the reader's copy still owns the space: nothing reused under it
    idx.release([lease])
    assert idx.alloc.used == 0


def test_a_reservation_on_a_poisoned_line_is_dropped_when_it_commits() -> None:
    idx, watch, ns, _ = _index()
    token, alloc = idx.reserve(ns, _key(7), 16 << 10)
    watch.submit([(alloc.extents[0][0], LINE)], "test")
    watch.step()
    watch.step()
    assert watch.stats()["reservations_watched"] == 1 and watch.busy
    idx.commit(token)
    watch.step()
    assert (ns, _key(7)) not in idx.entries and not watch.busy
    assert watch.stats()["blocks_dropped"] == 1


def test_poison_on_the_servers_own_areas_is_said_loudly_and_not_quarantined() -> None:
    idx, watch, _ns, logged = _index()
    watch.submit([(4 << 20, LINE), (100, LINE)], "test")  # the journal, then the header
    watch.step()
    assert len(logged) == 2 and "JOURNAL" in logged[0] and "HEADER" in logged[1]
    assert "server's own areas" in watch.note
    assert idx.alloc.quarantined == {}
    assert {o["area"] for o in watch.stats()["outside_kv"]} == {"journal", "header"}  # type: ignore[union-attr]


# --- POST /poison on an in-process server -----------------------------------------------------------
def _post(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/poison", body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_post_poison_queues_ranges_and_refuses_bad_bodies(pool_path: Path) -> None:
    from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
    from belugactl.pool.mapping import PoolMapping

    pool = PoolMapping.open(pool_path)
    srv = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=0, fence_grace_s=0, poison_check_s=0))
    try:
        srv.start()
        port = srv.admin_port
        assert port
        kv = srv.geometry.shared_kv_offset
        status, body = _post(port, json.dumps({"ranges": [{"offset": kv + 8192, "length": 64}]}).encode())
        assert (status, body["queued"]) == (200, 1)
        assert _post(port, b'{"ranges": [{"offset": -1, "length": 64}]}')[0] == 400
        assert _post(port, b"x" * (MAX_BODY + 1))[0] == 413
        srv.housekeeping()  # the loop applies what was queued
        assert srv.snapshot["poison"]["chunks_quarantined"] == 1
        assert srv.snapshot["poison"]["pushes"] == 1  # the refused ones queued nothing
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        conn.close()
        assert "beluga_mds_quarantined_bytes 2.097152e+06" in metrics
        assert srv.readiness() == (True, "ready")
        assert _post(port, b'{"ranges": [{"offset": 4096, "length": 64}]}')[0] == 200  # the header
        assert _post(port, b'{"ranges": []}', {"Content-Length": ""})[0] == 411
        srv.housekeeping()
        ready, reason = srv.readiness()
        assert ready and "poisoned range(s) in the server's own areas" in reason  # said loudly, still serving
        assert srv.snapshot["poison"]["outside_kv"] == [{"offset": 4096, "length": 64, "area": "header"}]
    finally:
        srv.close()
        pool.close()


def test_post_poison_off_loopback_is_refused_without_a_rack_secret() -> None:
    from belugactl.dataplane.mds.admin import post_poison

    class Httpd:
        write_verifier = None

    server = SimpleNamespace(geometry=SimpleNamespace(pool_size=1 << 30), poison=None)
    status, body = post_poison(server, Httpd(), "10.0.0.7", {"Content-Length": "2"}, None)
    assert status == 403 and "loopback" in body["error"]
    status, _ = post_poison(server, Httpd(), "::ffff:10.0.0.7", {"Content-Length": "2"}, None)
    assert status == 403


def test_a_flood_of_ranges_is_merged_at_the_cap_never_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    from belugactl.dataplane.mds import poison

    monkeypatch.setattr(poison, "MAX_RANGES", 4)
    idx, watch, _ns, _ = _index(chunks=8)
    lines = [BASE + i * CHUNK + 128 for i in range(8)]
    watch.submit([(off, LINE) for off in lines], "flood")
    watch.step()
    assert len(watch.known) <= 4
    assert all(watch.kv.overlaps(off, off + LINE) for off in lines)  # every line still covered
    assert len(idx.alloc.quarantined) == 8
    assert watch.submit([(0, 64)] * (4 * MAX_RANGES_PER_POST), "flood") == 4 * MAX_RANGES_PER_POST
    assert watch.submit([(0, 64)], "one more") == 0  # the inbox is full: refused (503), not queued


def test_queued_ranges_are_applied_a_bounded_number_a_step() -> None:
    from belugactl.dataplane.mds.poison import APPLY_STEP

    idx, watch, _ns, _ = _index(chunks=8)
    lines = [BASE + i * 4 * LINE for i in range(3 * APPLY_STEP)]  # distinct lines in the first chunk
    watch.submit([(off, LINE) for off in lines], "many")
    watch.step()
    assert len(watch.known) == APPLY_STEP and watch.busy
    while watch.busy:
        watch.step()
    assert len(watch.known) == 3 * APPLY_STEP


def test_the_periodic_check_queues_only_what_it_had_not_queued() -> None:
    _idx, watch, _ns, _ = _index()
    watch.record_check([(BASE, LINE)], None)
    watch.record_check([(BASE, LINE)], None)
    watch.record_check(None, "cxl list failed")
    watch.record_check([(BASE, LINE), (BASE + CHUNK, LINE)], None)
    s = watch.stats()
    assert (s["checks"], s["checks_unread"], s["ranges_received"], s["pushes"]) == (4, 1, 2, 0)
    assert s["last_check"]["read"]  # type: ignore[index]
