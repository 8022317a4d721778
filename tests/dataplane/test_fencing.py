"""Fencing is enforced: an earlier epoch's reservations are quarantined until their writers' deadlines pass,
and writers stop on their own deadline or when the epoch moves."""

from __future__ import annotations

import time
from pathlib import Path

from belugactl.dataplane.client import Reservation
from belugactl.dataplane.mds.fencing import FENCE_LINE, Fencing
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping

TTL = 30.0


def server_on(pool: PoolMapping) -> MetadataServer:
    from belugactl.dataplane.mds.index import IndexConfig

    s = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, index=IndexConfig(reservation_ttl_s=TTL)))
    s.start()
    return s


def reserve(server: MetadataServer, key: bytes) -> int:
    svc = server.service
    ns = p.decode_u32(svc.handle(Op.OPEN_NS, svc.epoch32, p.encode_name("m"), 200)[1], "ns")
    code, _rep = svc.handle(Op.RESERVE, svc.epoch32, p.encode_reserve(ns, key, 4096), 200, 1)
    return code


def test_a_fresh_pool_has_no_quarantine(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server = server_on(pool)
    assert server.fencing.quarantine_s == 0 and reserve(server, b"a" * 8) == Code.OK
    server.close()
    pool.close()


def test_a_crash_with_reservations_open_quarantines_the_next_epoch(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    first = server_on(pool)
    assert reserve(first, b"a" * 8) == Code.OK
    first._unlock_pool()  # SIGKILL: no clean shutdown, the fence line keeps the deadline
    second = server_on(pool)
    assert TTL - 2 < second.fencing.quarantine_s <= TTL + 1
    assert reserve(second, b"b" * 8) == Code.NOT_READY  # extents may still be written by epoch N
    assert second.readiness()[0]  # lookups and reads are served meanwhile
    # Once the old writers' deadlines passed, reservations are handed out again.
    second.fencing.quarantine_until = time.monotonic() - 1
    second.housekeeping()
    assert reserve(second, b"b" * 8) == Code.OK
    second.close()
    pool.close()


def test_a_clean_stop_with_nothing_open_needs_no_quarantine(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    first = server_on(pool)
    assert reserve(first, b"a" * 8) == Code.OK
    first.index.abort(next(iter(first.index.pending)))
    first.close()
    second = server_on(pool)
    assert second.fencing.quarantine_s == 0 and reserve(second, b"b" * 8) == Code.OK
    second.close()
    pool.close()


def test_a_recorded_deadline_in_the_past_is_not_waited_for(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    first = server_on(pool)
    reserve(first, b"a" * 8)
    first._unlock_pool()
    off = first.fencing.offset
    assert off == first.geometry.journal_offset + FENCE_LINE
    pool.write(off, (time.time_ns() - 10**9).to_bytes(8, "little"))  # the old writers' time is up
    second = server_on(pool)
    assert second.fencing.quarantine_s == 0
    second.close()
    pool.close()


def test_without_a_fence_line_a_restart_waits_a_whole_window(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server = server_on(pool)
    g = server.geometry
    f = Fencing(pool, type(g)(**{**vars(g), "journal_size": 0}), server.service, 7.0)
    f.start(previous_epoch=3)
    assert f.quarantine_s == 7.0 and server.service.reserve_blocked
    server.close()
    pool.close()


def test_writers_stop_at_their_deadline_and_on_a_new_epoch(pool_path: Path) -> None:
    import threading

    from belugactl.dataplane.client import connect

    pool = PoolMapping.open(pool_path)
    server = server_on(pool)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    c = connect(f"cxl://{pool.path}#1", pool=pool, timeout_s=5)
    assert c.writer_window_s == TTL
    t0 = time.monotonic()
    r = c.reserve("m", b"w" * 8, 4096)
    assert t0 + 0.8 * TTL < r.deadline <= time.monotonic() + 0.9 * TTL and c.writable(r)
    assert not c.writable(Reservation(r.token, r.extents, r.nbytes, time.monotonic() - 1, r.epoch))
    pool.bump_epoch()  # another server took over the pool: the header says so before any reply does
    assert not c.writable(r)
    server.stop()
    thread.join(10)
    c.close()
    pool.close()
