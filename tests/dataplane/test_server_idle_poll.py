"""How the metadata server's loop waits when its rings are quiet: busy-poll, then a short warm period
of 0.1 ms looks, then the idle poll (only the idle poll when it never busy-polls); and waits under a
millisecond are not rounded up by epoll."""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from belugactl.dataplane.mds import server as server_mod
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig, idle_wait_timeout_s, quiet_wait_s
from belugactl.pool.mapping import PoolMapping


def test_the_wait_follows_busy_then_warm_then_idle() -> None:
    cfg = ServerConfig(idle_after_s=0.05, warm_after_s=0.05, warm_poll_s=0.0001, idle_poll_s=0.0005)
    assert quiet_wait_s(cfg, 0.01, rings=True) == 0.0  # busy-polling
    assert quiet_wait_s(cfg, 0.06, rings=True) == 0.0001  # warm: the client's next burst is near
    assert quiet_wait_s(cfg, 0.2, rings=True) == 0.0005  # idle
    assert quiet_wait_s(cfg, 0.0, rings=False) == 0.0005  # no rings: TCP wakes the select anyway
    # spin_after_ms 0 (the CPU demo): no busy-poll and no warm looks either, only the idle poll,
    # right after a request as later (the warm looks slowed the forward pass beside them).
    cpu = ServerConfig(idle_after_s=0.0)
    assert cpu.warm_poll_s < cpu.idle_poll_s and cpu.warm_after_s > 0
    for quiet in (0.0, 0.001, 0.049, 0.051, 1.0):
        assert quiet_wait_s(cpu, quiet, rings=True) == cpu.idle_poll_s


class RecordingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None):  # noqa: ANN201
        self.timeouts.append(timeout)
        return super().select(timeout)


@pytest.mark.parametrize(
    ("wait", "tcp_clients", "selects"),
    [
        (0.0001, False, [0, 0]),
        (0.0005, False, [0, 0]),
        (0.002, False, [0.002]),
        (0, False, [0]),
        (0.0005, True, [0.0005]),  # TCP clients connected: epoll wakes on their requests at once
    ],
)
def test_waits_under_a_millisecond_are_a_zero_select_and_a_sleep(
    pool_path: Path, monkeypatch: pytest.MonkeyPatch, wait: float, tcp_clients: bool, selects: list[float]
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(server_mod.time, "sleep", slept.append)
    pool = PoolMapping.open(pool_path)
    srv = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    a, b = socket.socketpair()
    try:
        srv.start()
        sel = RecordingSelector()
        sel.register(a, selectors.EVENT_READ, lambda mask: None)
        srv.selector = sel
        srv.poll_selector(wait, tcp_clients)
        assert sel.timeouts == selects
        assert slept == ([wait] if 0 < wait < 0.001 and not tcp_clients else [])
        # A TCP request already waiting is served without the sleep.
        b.send(b"x")
        slept.clear()
        sel.timeouts.clear()
        srv.poll_selector(wait, tcp_clients)
        assert slept == [] and sel.timeouts[0] in (0, wait)
    finally:
        a.close()
        b.close()
        srv.close()
        pool.close()


def test_an_idle_wait_lasts_until_housekeeping_and_not_past_the_warm_looks() -> None:
    cfg = ServerConfig(idle_after_s=0.05, warm_after_s=0.05, warm_poll_s=0.0001, idle_poll_s=0.0005)
    assert idle_wait_timeout_s(cfg, 0.2, 0.08) == pytest.approx(0.08)  # idle: until the housekeeping
    assert idle_wait_timeout_s(cfg, 0.07, 0.08) == pytest.approx(0.03)  # warm: until its 0.1 ms looks end
    assert idle_wait_timeout_s(cfg, 0.07, 0.01) == pytest.approx(0.01)
    assert idle_wait_timeout_s(cfg, 0.2, -0.5) == 0.0  # housekeeping overdue: one look, no sleep
    cpu = ServerConfig(idle_after_s=0.0)  # never busy-polls: no warm phase to end
    assert idle_wait_timeout_s(cpu, 0.0, 0.1) == pytest.approx(0.1)


IDLE_WAIT_IMPLS = [pytest.param(True, id="native", marks=pytest.mark.native), pytest.param(False, id="python")]


@pytest.mark.parametrize("use_native", IDLE_WAIT_IMPLS)
def test_idle_wait_any_wakes_on_a_word_a_socket_or_the_timeout(use_native: bool) -> None:
    from array import array

    from belugactl.dataplane import native

    idle_wait_any = native._native.idle_wait_any if use_native else native._py_idle_wait_any
    buf = bytearray(64)
    offs = array("q", [8, 32])
    a, b = socket.socketpair()
    try:
        t0 = time.monotonic()
        assert idle_wait_any(buf, offs, 7, 30_000_000, 500_000, False, a.fileno()) == -1
        assert 0.025 < time.monotonic() - t0 < 1.0  # it waited its timeout, sleeping between looks
        timer = threading.Timer(0.02, lambda: struct.pack_into("<Q", buf, 32, 7))
        timer.start()
        t0 = time.monotonic()
        assert idle_wait_any(buf, offs, 7, 5_000_000_000, 200_000, False, a.fileno()) == 1
        assert time.monotonic() - t0 < 1.0
        timer.join()
        struct.pack_into("<Q", buf, 32, 0)
        b.send(b"x")
        assert idle_wait_any(buf, offs, 7, 5_000_000_000, 200_000, False, a.fileno()) == -2
        assert idle_wait_any(buf, offs, 7, 20_000_000, 200_000, False, -1) == -1  # no fd: only the words
        with pytest.raises(ValueError):
            idle_wait_any(buf, array("q", [60]), 7, 1000, 1000)  # a word past the buffer
        with pytest.raises(ValueError):
            idle_wait_any(buf, offs, 7, 1000, 0)  # a sleep of nothing would be a busy loop
        with pytest.raises((ValueError, OSError)):
            fd = a.fileno()
            a.close()
            idle_wait_any(buf, offs, 7, 50_000_000, 100_000, False, fd)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("fast_path", [True, False], ids=["native-server", "python-server"])
def test_a_server_in_its_idle_wait_answers_its_rings_and_accepts_tcp_at_once(pool_path: Path, fast_path: bool) -> None:
    """The real loop (serve_forever) with spin_after_ms 0, so it only ever waits idle: a ring request and
    a new TCP connection are both answered within the idle poll, not at the next housekeeping."""
    from belugactl.dataplane.client import KVIndexClient, connect
    from belugactl.dataplane.rpc.protocol import Op
    from belugactl.dataplane.rpc.transport_cxl import CxlTransport

    pool = PoolMapping.open(pool_path)
    cfg = ServerConfig(rpc_port=0, admin_port=None, fence_grace_s=0, idle_after_s=0.0, fast_path=fast_path)
    cfg.housekeeping_s = 3.0  # an idle wait would last this long if only the housekeeping ended it
    srv = MetadataServer(pool, cfg)
    srv.start()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        time.sleep(0.2)  # into its idle wait
        c = KVIndexClient(CxlTransport(pool, 1), address="cxl://test#1", client_id=1, timeout_s=5.0)
        c.reconnect()
        for _ in range(20):
            time.sleep(0.01)
            t0 = time.monotonic()
            c.transport.call(Op.PING, c._epoch32, b"p", 5_000_000_000)
            assert time.monotonic() - t0 < 1.0
        time.sleep(0.2)
        t0 = time.monotonic()
        tcp = connect(f"tcp://127.0.0.1:{srv.tcp_port}", timeout_s=5)  # accepted, HELLO answered
        tcp.close()
        assert time.monotonic() - t0 < 1.0
    finally:
        srv.stop()  # seen at the latest when the idle wait ends at the housekeeping
        thread.join(timeout=10)
        assert not thread.is_alive()
        pool.close()


def test_an_idle_wait_answers_the_fast_paths_requests_in_the_same_call(pool_path: Path) -> None:
    """RingListener.idle_wait on the fast path: a PING or GET_MANY that arrives mid-wait is answered by
    the idle wait itself (no turn of the Python loop first), its lease bookkept before the wait
    returns; a request the fast path leaves to Python (RELEASE) ends the wait unanswered, and so does
    a hostile slot (Python answers it BAD_MAGIC, and the next idle wait serves on); a socket ends it as -2, the
    timeout as -1; a closed fd is refused."""
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, REQ_READY, Op
    from belugactl.dataplane.rpc.transport_cxl import CxlTransport

    pool = PoolMapping.open(pool_path)
    srv = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=True))
    a, b = socket.socketpair()
    try:
        srv.start()
        ring, epoch, ns_timeout = srv.ring, srv.service.epoch32, 5_000_000_000
        assert ring._fast is not None  # the native helper is built
        t = CxlTransport(pool, 1)
        later = threading.Timer(0.05, t.submit, (Op.PING, epoch, b"mid-wait"))
        later.start()
        t0 = time.monotonic()
        assert ring.idle_wait(0.0002, 5.0) == (-1, 1)  # answered, then back for the bookkeeping
        assert 0.04 < time.monotonic() - t0 < 2.0
        assert t.collect(ns_timeout) == (0, epoch, b"mid-wait")
        # A GET_MANY hit: its lease is granted in C and applied to the index before idle_wait returns.
        ns = srv.index.open_namespace("n")
        tok, _ext = srv.index.reserve(ns, b"k" * 32, 4096, 1)
        srv.index.commit(tok, 1)
        t.submit(Op.GET_MANY, epoch, p.encode_lookup(ns, [b"k" * 32, b"x" * 32]))
        assert ring.idle_wait(0.0002, 5.0) == (-1, 1)
        assert srv.index.burst_leases == 1 and srv.index.entries[(ns, b"k" * 32)].leases == 1
        (lease, nbytes, extents, _crc), (absent, *_rest) = p.decode_get_many_reply_ex(t.collect(ns_timeout)[2])
        assert lease and nbytes == 4096 and extents and absent == 0
        # RELEASE is Python's: the idle wait ends on it, answers nothing, and the loop's serve answers it.
        t.submit(Op.RELEASE, epoch, p.encode_release([lease]))
        got, answered = ring.idle_wait(0.0002, 5.0)
        assert got >= 0 and answered == 0
        assert ring.serve(0) == 1 and p.decode_u32(t.collect(ns_timeout)[2], "RELEASE reply") == 1
        # A hostile slot (wrong magic) mid-wait: left to Python, which answers it BAD_MAGIC; the
        # idle wait after it answers the next ping as before.
        off = t._offsets[t._seq % t.slots_per_ring]
        pool.buf[off + HEADER_SIZE : off + HEADER_SIZE + 4] = b"evil"
        HEADER.pack_into(pool.buf, off, REQ_READY, t._seq, 0xBAD, epoch, Op.PING, 0, 4)
        t._seq += 1
        t._inflight.append(t._seq - 1)
        got, answered = ring.idle_wait(0.0002, 5.0)
        assert got >= 0 and answered == 0
        assert ring.serve(0) == 1 and ring.bad_slots == 1
        assert t.collect(ns_timeout)[0] == p.Code.BAD_MAGIC
        t.submit(Op.PING, epoch, b"after")
        assert ring.idle_wait(0.0002, 5.0) == (-1, 1) and t.collect(ns_timeout) == (0, epoch, b"after")
        # The selector's fd, the timeout, a closed fd.
        b.send(b"x")
        assert ring.idle_wait(0.0002, 5.0, a.fileno()) == (-2, 0)
        t0 = time.monotonic()
        assert ring.idle_wait(0.0002, 0.03) == (-1, 0) and time.monotonic() - t0 >= 0.025
        fd = os.dup(a.fileno())
        os.close(fd)
        with pytest.raises(ValueError, match="not open"):
            ring.idle_wait(0.0002, 0.05, fd)
    finally:
        a.close()
        b.close()
        srv.close()
        pool.close()
