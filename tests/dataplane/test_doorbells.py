"""The rings' doorbells (docs/pool-format.md, "Doorbells"; _native_ring.c): a client bumps its ring's
byte after publishing a request, the server looks only at the rings whose byte moved, plus a slow sweep.

The native state is driven by hand here (`bells_take` with a zero timeout is one look); the server
tests run the listener in its doorbell mode (the fast path off) in this process, without threads.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds import listener_cxl
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, REQ_READY, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.geometry import DOORBELL_OFFSET
from belugactl.pool.mapping import PoolMapping

pytestmark = pytest.mark.native
NS = 5_000_000_000
NEVER = 10**15  # a sweep period no test reaches: only the doorbells lead
SLOT, SLOTS, RINGS = 256, 4, 100  # 100 rings: two doorbell lines, the second one partly used
RPC = 2 << 20


class Rings:
    """A private mapping laid out as a pool's header region and rings, without a server."""

    def __init__(self, rings: int = RINGS) -> None:
        self.R = rings
        self.mm = mmap.mmap(-1, RPC + rings * SLOTS * SLOT)
        self.buf = memoryview(self.mm)
        # The listener's 2R words: each ring's cursor slot (slot 0 here), then its slot 0.
        self.offs = array("q", [self.slot(r, 0) for r in range(rings)] * 2)
        self.handles: list[int] = []

    def slot(self, ring: int, s: int) -> int:
        return RPC + (ring * SLOTS + s) * SLOT

    def register(self, ring: int) -> int:
        h = native._native.bell_register(self.buf, self.slot(ring, 0), SLOTS * SLOT, DOORBELL_OFFSET + ring)
        assert h >= 0
        self.handles.append(h)
        return h

    def bell(self, ring: int) -> int:
        return self.buf[DOORBELL_OFFSET + ring]

    def send(self, ring: int, s: int = 0) -> None:
        """A request as the native client publishes it (it rings the doorbell when registered)."""
        slots.send(self.buf, self.slot(ring, s), s, 1, int(Op.PING), b"x", False)

    def send_silently(self, ring: int, s: int = 0) -> None:
        """A request that rings nothing: an old client, a lost bump."""
        off = self.slot(ring, s)
        HEADER.pack_into(self.buf, off, 0, s, MAGIC, 1, int(Op.PING), 0, 1)
        native.store64(self.buf, off, REQ_READY)

    def answer(self, ring: int, s: int = 0) -> None:
        native.store64(self.buf, self.slot(ring, s), 0)

    def close(self) -> None:
        for h in self.handles:
            native._native.bell_unregister(h)
        self.buf.release()
        self.mm.close()


@pytest.fixture
def rings() -> Iterator[Rings]:
    if getattr(native._native, "bells_new", None) is None:
        pytest.skip("the native helper has no doorbells")
    r = Rings()
    yield r
    r.close()


def take(rings: Rings, state: object, flush: bool = False) -> int | None:
    t = native._native.bells_take(rings.buf, rings.offs, state, SLOT - HEADER_SIZE, 0, flush)
    return None if t is None else t[0]


def settled(rings: Rings, sweep_ns: int = NEVER) -> object:
    """A server's doorbell state after its first look (every ring once, then none pending)."""
    state = native._native.bells_new(rings.R, DOORBELL_OFFSET, sweep_ns)
    assert take(rings, state) is None
    assert native._native.bells_stats(state)["pending"] == 0
    return state


def test_a_registered_rings_request_bumps_its_doorbell_and_no_other(rings: Rings) -> None:
    rings.register(7)
    rings.send(7)
    rings.send(8)  # not registered: rings nothing
    assert [rings.bell(r) for r in (6, 7, 8)] == [0, 1, 0]
    rings.send(7, 1)
    assert rings.bell(7) == 2


def test_an_unregistered_ring_rings_nothing_once_its_last_registration_goes(rings: Rings) -> None:
    first, second = rings.register(3), rings.register(3)
    native._native.bell_unregister(first)
    rings.send(3)
    assert rings.bell(3) == 1  # the other registration of the same ring still rings
    native._native.bell_unregister(second)
    rings.handles.clear()
    rings.send(3, 1)
    assert rings.bell(3) == 1


def test_the_server_looks_only_at_rings_whose_doorbell_moved(rings: Rings) -> None:
    rings.register(42)
    state = settled(rings)
    for _ in range(5):
        assert take(rings, state) is None
    assert native._native.bells_stats(state)["looks"] == RINGS  # the first look's, and none since
    rings.send(42)
    assert take(rings, state) == 42
    stats = native._native.bells_stats(state)
    assert stats["looks"] == RINGS + 1 and stats["rung"] == 1


def test_a_request_published_after_the_take_rings_again(rings: Rings) -> None:
    rings.register(5)
    state = settled(rings)
    rings.send(5)
    assert take(rings, state) == 5
    rings.answer(5)
    assert take(rings, state) is None  # looked at, empty: no longer pending
    rings.send(5, 1)  # the client's next request, in the next slot
    rings.offs[5] = rings.slot(5, 1)  # the server's cursor moved on
    assert take(rings, state) == 5


def test_a_reconnecting_clients_slot_0_is_found_by_its_doorbell(rings: Rings) -> None:
    rings.register(9)
    state = settled(rings)
    rings.offs[9] = rings.slot(9, 2)  # the server's cursor is mid-ring; the client restarted at slot 0
    rings.send(9, 0)
    assert take(rings, state) == RINGS + 9


def test_a_request_without_a_doorbell_is_answered_by_the_sweep(rings: Rings) -> None:
    quiet = settled(rings)
    sweeping = settled(rings, sweep_ns=1)  # every ring due at each look
    rings.send_silently(61)
    assert take(rings, quiet) is None
    assert take(rings, sweeping) == 61


def test_the_sweep_adds_a_slice_of_rings_per_look_not_every_ring(rings: Rings) -> None:
    state = settled(rings, sweep_ns=NEVER // 10**6)  # a ring every ~1000 s: none due in this test
    before = native._native.bells_stats(state)["looks"]
    for _ in range(50):
        take(rings, state)
    assert native._native.bells_stats(state)["looks"] == before


def test_a_flooding_ring_does_not_starve_another(rings: Rings) -> None:
    rings.register(1)
    rings.register(2)
    state = settled(rings)
    rings.send(1)
    rings.send(2)
    seen = []
    for _ in range(4):
        r = take(rings, state)
        seen.append(r)
        if r == 1:
            rings.send(1)  # the flood: ring 1 is never empty
        else:
            rings.answer(r)
    assert 2 in seen[:2]


def test_garbage_in_the_doorbells_costs_one_look_per_ring_and_is_never_taken(rings: Rings) -> None:
    state = settled(rings)
    rings.buf[DOORBELL_OFFSET : DOORBELL_OFFSET + 128] = bytes(range(1, 129))  # every byte, past the rings too
    assert take(rings, state) is None
    stats = native._native.bells_stats(state)
    assert stats["rung"] == RINGS and stats["looks"] == 2 * RINGS  # the first look's, then one each
    assert take(rings, state) is None
    assert native._native.bells_stats(state)["looks"] == 2 * RINGS  # unchanged garbage: nothing more


def test_bad_doorbell_state_arguments_are_refused(rings: Rings) -> None:
    with pytest.raises(ValueError):
        native._native.bells_new(0, DOORBELL_OFFSET, 1)
    with pytest.raises(ValueError):
        native._native.bells_new(RINGS, DOORBELL_OFFSET + 1, 1)  # not line-aligned
    state = native._native.bells_new(RINGS, len(rings.buf) - 64, 1)  # the area past the mapping
    with pytest.raises(ValueError):
        take(rings, state)
    state = native._native.bells_new(RINGS, DOORBELL_OFFSET, 1)
    with pytest.raises(ValueError):  # offsets for another ring count
        native._native.bells_take(rings.buf, rings.offs[:-2], state, SLOT - HEADER_SIZE, 0, False)
    with pytest.raises(ValueError):  # not a doorbell state
        native._native.bells_take(rings.buf, rings.offs, object(), SLOT - HEADER_SIZE, 0, False)


# --- the server's listener in its doorbell mode -----------------------------------------------------


@pytest.fixture
def doorbell_server(pool_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PoolMapping, MetadataServer]]:
    if getattr(native._native, "bells_new", None) is None:
        pytest.skip("the native helper has no doorbells")
    monkeypatch.setattr(listener_cxl, "SWEEP_S", 1000.0)  # only the doorbells lead
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=False))
    server.start()
    assert server.ring._bells is not None
    yield pool, server
    server.close()
    pool.close()


def test_the_server_answers_a_transports_requests_by_their_doorbells(
    doorbell_server: tuple[PoolMapping, MetadataServer],
) -> None:
    pool, server = doorbell_server
    t = CxlTransport(pool, 3)
    bell = pool.geometry.doorbell_offset(3)
    for i in range(2 * pool.geometry.slots_per_ring):  # past the ring's wrap
        before = pool.buf[bell]
        t.submit(Op.PING, server.epoch, b"p%d" % i)
        assert pool.buf[bell] == (before + 1) % 256
        assert server.poll_once(0)  # found at the first look: no wait for a sweep
        assert t.collect(NS)[2] == b"p%d" % i
    stats = server.ring.stats()["doorbells"]
    assert stats["rung"] >= 2 * pool.geometry.slots_per_ring and stats["swept"] == 0
    t.close()


def test_a_closed_transport_rings_nothing(doorbell_server: tuple[PoolMapping, MetadataServer]) -> None:
    pool, server = doorbell_server
    t = CxlTransport(pool, 4)
    bell = pool.geometry.doorbell_offset(4)
    t.close()
    off = pool.geometry.slot_offset(4, 0)
    slots.send(pool.buf, off, 0, server.epoch, int(Op.PING), b"", pool.needs_flush)
    assert pool.buf[bell] == 0
