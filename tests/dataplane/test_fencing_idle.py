"""The save lockout after a crash is shortened only where fencing proves nobody may write (fencing.py):
no reservation open at the crash -> no quarantine; one open -> the whole window, whoever re-HELLOs."""

from __future__ import annotations

import time
from pathlib import Path

from belugactl.dataplane.mds.index import IndexConfig
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

TTL = 30.0
RING = 3


def server_on(pool: PoolMapping) -> MetadataServer:
    s = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, index=IndexConfig(reservation_ttl_s=TTL)))
    s.start()
    return s


def reserve(server: MetadataServer, key: bytes) -> tuple[int, int]:
    """RESERVE from ring RING; (code, token)."""
    svc = server.service
    ns = p.decode_u32(svc.handle(Op.OPEN_NS, svc.epoch32, p.encode_name("m"), 200, RING)[1], "ns")
    code, rep = svc.handle(Op.RESERVE, svc.epoch32, p.encode_reserve(ns, key, 4096), 200, RING)
    token = next(iter(server.index.pending)) if code == Code.OK else 0
    return code, token


def crash(server: MetadataServer) -> None:
    server._unlock_pool()  # SIGKILL: no clean shutdown, the fence line stays as it is


def test_a_crash_with_nothing_open_needs_no_quarantine(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    first = server_on(pool)
    code, token = reserve(first, b"a" * 8)
    assert code == Code.OK
    first.index.commit(token, checksum=zeros_crc(4096))  # written, then committed: its writer is done
    first.housekeeping()
    crash(first)
    second = server_on(pool)
    assert second.fencing.quarantine_s == 0 and not second.service.reserve_blocked
    assert reserve(second, b"b" * 8)[0] == Code.OK
    # ... and the line covers the new reservation again at once: a crash now must quarantine.
    crash(second)
    third = server_on(pool)
    assert TTL - 2 < third.fencing.quarantine_s <= TTL + 1
    third.close()
    pool.close()


def test_a_crash_with_a_reservation_open_keeps_the_window_even_after_its_ring_says_hello(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    first = server_on(pool)
    assert reserve(first, b"a" * 8)[0] == Code.OK
    first.housekeeping()  # open: the line is kept
    crash(first)
    second = server_on(pool)
    assert TTL - 2 < second.fencing.quarantine_s <= TTL + 1
    svc = second.service
    assert svc.handle(Op.HELLO, 0, p.encode_hello(1), 200, RING)[0] == Code.OK  # the ring that held it is back
    second.housekeeping()
    assert reserve(second, b"b" * 8)[0] == Code.NOT_READY  # not proof that its copy ended: still fenced
    second.fencing.quarantine_until = time.monotonic() - 1  # the old writers' deadline passed
    second.housekeeping()
    assert reserve(second, b"b" * 8)[0] == Code.OK
    second.close()
    pool.close()


def test_the_line_is_not_rewritten_per_request(pool_path: Path, monkeypatch) -> None:
    pool = PoolMapping.open(pool_path)
    server = server_on(pool)
    writes: list[int] = []
    real = server.fencing._write
    monkeypatch.setattr(server.fencing, "_write", lambda until: (writes.append(until), real(until))[1])
    for i in range(5):
        code, token = reserve(server, bytes([i]) * 8)
        server.index.commit(token, checksum=zeros_crc(4096))
        server.housekeeping()
    # one raise per reservation after an idle tick, one lowering per idle tick after it: never more
    assert len(writes) <= 10 and writes[-1] == 0
    server.close()
    pool.close()
