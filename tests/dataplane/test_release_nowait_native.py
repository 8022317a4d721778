"""A reader's lease release sent without waiting, in one native call (`rpc_release_nowait`,
`CxlTransport.release_nowait`, used by `KVIndexClient.release_nowait` on a CXL ring). Its slots must
hold exactly what the Python path (`encode_release` + `submit`) sends, byte for byte; a slot still
busy from an abandoned request stops it and breaks the ring; ids that are not 64-bit integers send
nothing; and against a real server the replies come back as the counts it returned say."""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.dataplane.client import KVIndexClient
from belugactl.dataplane.metadata_errors import MetadataUnavailable
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc import transport_cxl
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, REQ_READY, Op
from belugactl.dataplane.rpc.transport_cxl import CxlTransport
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_call_many import ServerThread
from tests.support.blocks import zeros_crc

pytestmark = pytest.mark.native
NS = 5_000_000_000
native_release = transport_cxl._rpc_release_nowait  # None without the helper: the module is `native`

SLOT, SLOTS = 256, 8  # a small ring in private memory: 8 slots of 224-byte payloads (27 ids each)
MAXP = SLOT - HEADER_SIZE


def _ring() -> tuple[bytearray, array]:
    return bytearray(SLOT * SLOTS), array("q", [i * SLOT for i in range(SLOTS)])


def _slots(buf: bytearray, first_seq: int, count: int) -> list[tuple[tuple, bytes]]:
    out = []
    for i in range(count):
        off = ((first_seq + i) % SLOTS) * SLOT
        head = HEADER.unpack_from(buf, off)
        out.append((head, bytes(buf[off + HEADER_SIZE : off + HEADER_SIZE + head[6]])))
    return out


@pytest.mark.parametrize("flags", [0, p.RELEASE_GRANTED_ELSEWHERE])
def test_the_slots_sent_are_what_the_python_path_sends(flags: int) -> None:
    rng = random.Random(7)
    per = p.release_capacity(MAXP)
    for n in (1, per - 1, per, per + 1, 3 * per + 5):
        ids = [rng.getrandbits(64) or 1 for _ in range(n)]
        with_zeros = [x for i in ids for x in ((0, i) if i % 5 == 0 else (i,))]  # zeros are skipped
        buf, offs = _ring()
        seq0 = rng.randrange(1 << 40)
        counts = native_release(buf, offs.tobytes(), seq0, 0xABCD, with_zeros, flags, per, MAXP, False)
        chunks = [ids[i : i + per] for i in range(0, n, per)]
        assert counts == [len(c) for c in chunks]
        for i, (head, payload) in enumerate(_slots(buf, seq0, len(chunks))):
            assert head == (REQ_READY, seq0 + i, MAGIC, 0xABCD, Op.RELEASE, 0, len(payload))
            assert payload == p.encode_release(chunks[i], flags)


def test_packed_ids_send_what_a_list_sends() -> None:
    """An array('Q') of ids (the vLLM worker packs its load's leases before the copy) sends the same
    slots as the list of the same ids; zeros are skipped either way; a buffer of odd size sends nothing."""
    rng = random.Random(11)
    per = p.release_capacity(MAXP)
    ids = [rng.getrandbits(64) or 1 for _ in range(2 * per + 3)]
    ids[4] = ids[per + 1] = 0
    got = []
    for form in (ids, array("Q", ids), bytes(array("Q", ids))):
        buf, offs = _ring()
        counts = native_release(buf, offs.tobytes(), 5, 7, form, 0, per, MAXP, False)
        got.append((counts, bytes(buf)))
    assert got[0] == got[1] == got[2] and sum(got[0][0]) == len(ids) - 2
    buf, offs = _ring()
    with pytest.raises(ValueError, match="8-byte"):
        native_release(buf, offs.tobytes(), 5, 7, b"\x01" * 12, 0, per, MAXP, False)
    assert not any(buf)


def test_a_moved_epoch_sends_nothing() -> None:
    """With the pool header's epoch word given (as the client does), a release after a server restart
    (the epoch moved) sends nothing and says so (-1); the unchanged epoch sends."""
    buf, offs = _ring()
    epoch_off = SLOT * (SLOTS - 1)  # a word of the buffer stands in for the pool header's epoch
    buf[epoch_off : epoch_off + 8] = (41).to_bytes(8, "little")
    assert native_release(buf, offs.tobytes(), 0, 1, [1, 2], 0, 4, MAXP, False, epoch_off, 40) == (-1, [])
    assert not any(buf[:epoch_off])
    assert native_release(buf, offs.tobytes(), 0, 1, [1, 2], 0, 4, MAXP, False, epoch_off, 41) == [2]
    with pytest.raises(ValueError):
        native_release(buf, offs.tobytes(), 0, 1, [1, 2], 0, 4, MAXP, False, len(buf), 41)  # a word past the buffer


def test_a_busy_slot_stops_the_sending_and_bad_ids_send_nothing() -> None:
    buf, offs = _ring()
    per = 4
    HEADER.pack_into(buf, 2 * SLOT, REQ_READY, 99, MAGIC, 1, Op.PING, 0, 0)  # abandoned request in slot 2
    assert native_release(buf, offs.tobytes(), 0, 1, list(range(1, 20)), 0, per, MAXP, False) == (-2, [4, 4])
    assert [h[0] for h, _ in _slots(buf, 0, 2)] == [REQ_READY, REQ_READY]
    for bad in ([1, -1], [1, 1 << 64], [1, "2"], 5):
        buf, offs = _ring()
        with pytest.raises((OverflowError, TypeError, ValueError)):
            native_release(buf, offs.tobytes(), 0, 1, bad, 0, per, MAXP, False)
        assert not any(buf)
    buf, offs = _ring()
    for per_message, maxp in ((0, MAXP), (28, MAXP), (4, SLOT)):  # no ids, more than a slot holds, past the ring
        with pytest.raises(ValueError):
            native_release(buf, offs.tobytes(), 0, 1, [1, 2], 0, per_message, maxp, False)
    assert not any(buf)


@contextmanager
def _client_on_ring(
    pool_path: Path, ring: int = 2, timeout_s: float = 2.0
) -> Iterator[tuple[PoolMapping, KVIndexClient, ServerThread]]:
    """A real server thread on the pool and a client joined on one of its rings."""
    pool = PoolMapping.open(pool_path)
    st = ServerThread(pool, fast_path=True)
    try:
        c = KVIndexClient(CxlTransport(pool, ring), address=f"cxl://test#{ring}", client_id=ring, timeout_s=timeout_s)
        c.reconnect()
        yield pool, c, st
    finally:
        st.close()
        pool.close()


def test_a_busy_slot_breaks_the_ring_and_the_client_reports_the_server_unavailable(pool_path: Path) -> None:
    with _client_on_ring(pool_path) as (pool, c, _st):
        t = c.transport
        pool.buf[t._offsets[t._seq % t.slots_per_ring] : t._offsets[t._seq % t.slots_per_ring] + 8] = (
            REQ_READY.to_bytes(8, "little")
        )
        with pytest.raises(MetadataUnavailable):
            c.release_nowait([1, 2, 3])
        assert t.broken


def _held(st: ServerThread, want: int, timeout: float = 5.0) -> int:
    """Leases the server holds on the test's entries, once its loop has bookkept them (the fast path
    applies a burst's leases just after answering it)."""
    deadline = time.monotonic() + timeout
    held = -1
    while time.monotonic() < deadline:
        held = sum(e.leases for e in list(st.server.index.entries.values()))
        if held == want:
            break
        time.sleep(0.01)
    return held


@pytest.mark.parametrize("native_send", [True, False], ids=["native", "python"])
def test_released_without_a_wait_against_a_real_server(pool_path: Path, native_send: bool, monkeypatch) -> None:
    if not native_send:
        monkeypatch.setattr(transport_cxl, "_rpc_release_nowait", None)
    with _client_on_ring(pool_path, ring=3, timeout_s=5.0) as (_pool, c, st):
        keys = [bytes([i]) * 32 for i in range(40)]
        for k in keys:
            c.commit(c.reserve("r", k, 4096).token, zeros_crc(4096))
        leases = [loc[1] for loc in c.get_many_tuples("r", keys)]
        assert len(set(leases)) == 40 and _held(st, 40) == 40
        sent = c.messages
        assert c.release_nowait(leases + [0], granted_elsewhere=False) is True
        assert c.replies_pending == c.messages - sent >= 1
        c.collect_replies()
        assert c.replies_pending == 0 and c.nowait_leases_ended == 0 and c.nowait_refused == 0
        assert _held(st, 0) == 0
        assert all(loc is not None for loc in c.get_many_tuples("r", keys))  # the ring is in step


def test_a_release_after_the_pool_epoch_moved_is_fenced_without_sending(pool_path: Path) -> None:
    from belugactl.dataplane.metadata_errors import StaleEpoch

    with _client_on_ring(pool_path) as (_pool, c, _st):
        t = c.transport
        seq = t._seq
        t.fence_epoch = c.epoch + 1  # as if the server restarted after this client joined
        with pytest.raises(StaleEpoch):
            c.release_nowait(array("Q", [1, 2, 3]))
        assert t._seq == seq and t.pending == 0 and c.replies_pending == 0  # nothing was sent
