"""Hostile doorbells (docs/pool-format.md, "Doorbells"): a client that lies with its doorbells, or
sends without them, against a real metadata server whose ring listener is in its doorbell mode
(the fast path off), polled in this process: a lie costs the server a look per ring it names, never
an answer to anyone, and a request without a doorbell is answered by the sweep."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds import listener_cxl
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.geometry import DOORBELL_OFFSET
from belugactl.pool.mapping import PoolMapping

pytestmark = [pytest.mark.hostile, pytest.mark.native]
NS = 5_000_000_000


def serve(
    pool_path: Path, sweep_s: float, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    if getattr(native._native, "bells_new", None) is None:
        pytest.skip("the native helper has no doorbells")
    monkeypatch.setattr(listener_cxl, "SWEEP_S", sweep_s)
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=False))
    server.start()
    assert server.ring._bells is not None
    server.poll_once(0)  # the first look: every ring once
    yield pool, server
    server.close()
    pool.close()


@pytest.fixture
def quiet_sweep(pool_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    yield from serve(pool_path, 1000.0, monkeypatch)


@pytest.fixture
def fast_sweep(pool_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    yield from serve(pool_path, 0.01, monkeypatch)


def looks(server: MetadataServer) -> int:
    return server.ring.stats()["doorbells"]["looks"]


def test_every_doorbell_rung_constantly_costs_a_look_per_ring_and_an_honest_client_is_answered(
    quiet_sweep: tuple[PoolMapping, MetadataServer],
) -> None:
    pool, server = quiet_sweep
    g = pool.geometry
    honest = CxlTransport(pool, 2)
    for i in range(20):
        # The liar rewrites every doorbell byte (and the bytes past the last ring) before each look.
        pool.buf[DOORBELL_OFFSET : DOORBELL_OFFSET + g.doorbell_size] = os.urandom(g.doorbell_size)
        before = looks(server)
        assert not server.poll_once(0)  # nothing to answer: the lie found no request
        assert looks(server) - before <= g.ring_count  # at most a look per ring, never a spin
        seen = pool.buf[g.doorbell_offset(2)]  # what the server saw at its last look
        honest.submit(Op.PING, server.epoch, b"%d" % i)
        lie = bytearray(os.urandom(g.doorbell_size))
        # A liar that writes back exactly the value the server last saw hides the request until the
        # sweep (test_a_request_without_a_doorbell_is_answered_by_the_sweep); any other byte is a ring.
        if lie[g.doorbell_offset(2) - DOORBELL_OFFSET] == seen:
            lie[g.doorbell_offset(2) - DOORBELL_OFFSET] = (seen + 1) % 256
        pool.buf[DOORBELL_OFFSET : DOORBELL_OFFSET + g.doorbell_size] = bytes(lie)
        assert server.poll_once(0)  # the honest request, at the first look, whatever else the liar wrote
        assert honest.collect(NS)[2] == b"%d" % i
    honest.close()


def test_a_doorbell_without_a_request_costs_one_look(quiet_sweep: tuple[PoolMapping, MetadataServer]) -> None:
    pool, server = quiet_sweep
    bell = pool.geometry.doorbell_offset(5)
    for i in range(1, 10):
        before = looks(server)
        pool.buf[bell] = i % 256
        assert not server.poll_once(0)
        assert looks(server) - before == 1
    before = looks(server)
    assert not server.poll_once(0)  # rung no more: looked at no more
    assert looks(server) == before


def test_a_request_without_a_doorbell_is_answered_by_the_sweep(fast_sweep: tuple[PoolMapping, MetadataServer]) -> None:
    pool, server = fast_sweep
    g = pool.geometry
    t = CxlTransport(pool, 6)
    t.close()  # unregistered: its requests ring nothing (an old client, a lost bump)
    off = g.slot_offset(6, 0)
    slots.send(pool.buf, off, 0, server.epoch, int(Op.PING), b"silent", pool.needs_flush)
    assert pool.buf[g.doorbell_offset(6)] == 0
    assert server.poll_once(NS)  # the sweep reaches ring 6 within a period (10 ms here)
    code, _epoch, rep = slots.wait_reply(pool.buf, off, 0, g.slot_size - 32, NS, pool.needs_flush)
    assert code == 0 and rep == b"silent"
    assert server.ring.stats()["doorbells"]["swept"] > 0


def test_a_flooding_ring_does_not_starve_another(quiet_sweep: tuple[PoolMapping, MetadataServer]) -> None:
    pool, server = quiet_sweep
    flood, other = CxlTransport(pool, 1), CxlTransport(pool, 3)
    for i in range(pool.geometry.slots_per_ring):
        flood.submit(Op.PING, server.epoch, b"f%d" % i)
    other.submit(Op.PING, server.epoch, b"me")
    assert server.poll_once(0) and server.poll_once(0)  # two turns: one of them is the other ring's
    assert other.collect(NS)[2] == b"me"
    for _ in range(pool.geometry.slots_per_ring - 1):  # the rest of the flood (one went in those two turns)
        assert server.poll_once(NS)
    while flood.pending:
        flood.collect(NS)
    flood.close()
    other.close()
