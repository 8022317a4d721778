"""The native fast path reads the doorbells from `RingListener.fast_bells_from_rings` rings up (below
it, its pass over every ring is cheaper): requests that ring are answered in C, and a request that
rings nothing (an old client, a lost bump) is still answered, by the sweep."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds import listener_cxl
from belugactl.dataplane.mds.listener_cxl import RingListener
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import HEADER_SIZE, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.mapping import PoolMapping

pytestmark = pytest.mark.native
NS = 2_000_000_000


def _server(pool_path: Path) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    if getattr(native._native, "FAST_SERVE_BELLS", None) is None or native.fast_serve is None:
        pytest.skip("the native helper's fast path does not read doorbells")
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.start()
    yield pool, server
    server.close()
    pool.close()


@pytest.fixture
def bells_in_c(pool_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    monkeypatch.setattr(RingListener, "fast_bells_from_rings", 1)
    monkeypatch.setattr(listener_cxl, "SWEEP_S", 0.01)
    yield from _server(pool_path)


def test_below_the_threshold_the_fast_path_keeps_its_pass(pool_path: Path) -> None:
    for _pool, server in _server(pool_path):
        assert server.geometry.ring_count < RingListener.fast_bells_from_rings
        st = server.ring.stats()
        assert st["native_fast_path"] and not st["doorbells_in_fast_path"] and st["doorbells"] is None


def test_a_ringing_request_is_answered_by_the_fast_path_reading_doorbells(bells_in_c) -> None:
    pool, server = bells_in_c
    st = server.ring.stats()
    assert st["native_fast_path"] and st["doorbells_in_fast_path"]
    t = CxlTransport(pool, 3)
    try:
        for i in range(5):
            before = server.ring.stats()["doorbells"]["looks"]
            t.submit(Op.PING, server.epoch, b"ping %d" % i)
            served = 0
            for _ in range(100):  # bounded: each serve() spins up to NS for a request
                served += server.ring.serve(NS)
                if served:
                    break
            code, _epoch, rep = t.collect(NS)
            assert code == 0 and rep == b"ping %d" % i
            assert server.ring.stats()["doorbells"]["looks"] > before  # found through the doorbells
    finally:
        t.close()
    assert server.ring.stats()["fast_requests"] >= 5


def test_a_request_that_rings_nothing_is_answered_by_the_sweep_in_the_fast_path(bells_in_c) -> None:
    pool, server = bells_in_c
    g = pool.geometry
    t = CxlTransport(pool, 6)
    t.close()  # unregistered: its requests ring nothing
    off = g.slot_offset(6, 0)
    slots.send(pool.buf, off, 0, server.epoch, int(Op.PING), b"silent", pool.needs_flush)
    assert pool.buf[g.doorbell_offset(6)] == 0
    served = 0
    for _ in range(100):  # the sweep reaches ring 6 within SWEEP_S (10 ms here)
        served += server.ring.serve(NS // 20)
        if served:
            break
    assert served == 1
    assert slots.wait_reply(pool.buf, off, 0, g.slot_size - HEADER_SIZE, NS, pool.needs_flush)[2] == b"silent"
