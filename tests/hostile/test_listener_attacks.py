"""Connection floods, idle connections, huge partial frames and EMFILE: bounded memory, no spinning,
and a well-behaved client served throughout."""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import pytest

from belugactl.dataplane.client import connect
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, start_mds, until, well_behaved_round_trip

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
MiB = 1 << 20


def _open(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return None


def _closed_by_server(sock: socket.socket, timeout: float = 0.2) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_connection_flood_is_capped_and_a_good_client_is_served(mds) -> None:
    pool = PoolMapping.open(mds.pool_path)
    good = connect(mds.tcp, timeout_s=5)  # connected before the flood: holds its slot
    rss0 = mds.rss()
    flood = [s for s in (_open(mds.port) for _ in range(200)) if s is not None]
    try:
        assert good.ping(b"still here") == b"still here"
        assert until(lambda: mds.stats()["tcp"]["refused_over_cap"] > 0, 5)
        assert mds.stats()["tcp"]["connections"] <= 32
        refused = sum(_closed_by_server(s) for s in flood)
        assert refused >= len(flood) - 32
        well_behaved_round_trip(mds.cxl(1), pool, b"flood".ljust(32, b"."))
        assert mds.rss() - rss0 < 32 * MiB
    finally:
        for s in flood:
            s.close()
    good.close()
    pool.close()


def test_idle_connections_are_closed_after_the_timeout(mds) -> None:
    idle = [s for s in (_open(mds.port) for _ in range(20)) if s is not None]
    good = connect(mds.tcp, timeout_s=5)
    try:
        # The timeout is 2 s; the good client keeps talking until the server has closed every idle one.
        deadline = time.monotonic() + 60
        while mds.stats()["tcp"]["closed_idle"] < 20:
            assert good.ping(b"x") == b"x"
            assert time.monotonic() < deadline, f"idle connections left open: {mds.stats()['tcp']}"
            time.sleep(0.2)
        assert good.ping(b"x") == b"x"
        assert all(_closed_by_server(s, 1.0) for s in idle)
        stats = mds.stats()["tcp"]
        assert stats["closed_idle"] >= 20 and stats["connections"] == 1
    finally:
        for s in idle:
            s.close()
    good.close()


def test_huge_and_partial_frames_are_bounded(mds) -> None:
    rss0 = mds.rss()
    socks = []
    try:
        for i in range(30):
            s = _open(mds.port)
            assert s is not None
            socks.append(s)
            if i % 2:
                s.sendall(struct.pack("<I", 1 << 30) + b"\0" * 4096)  # a 1 GiB frame: refused at once
            else:
                s.sendall(struct.pack("<I", 60 << 10) + b"\0" * (50 << 10))  # a partial frame under the cap
        assert until(lambda: mds.stats()["tcp"]["closed_oversize"] >= 15, 5)
        assert all(_closed_by_server(s, 1.0) for s in socks[1::2])
        assert mds.stats()["tcp"]["buffered_bytes"] <= 15 * (64 << 10)
        assert mds.rss() - rss0 < 32 * MiB
        pool = PoolMapping.open(mds.pool_path)
        well_behaved_round_trip(mds.tcp, pool, b"partial".ljust(32, b"."))
        pool.close()
        # the partial frames are never completed: the idle timeout closes them too
        assert until(lambda: all(_closed_by_server(s, 0.05) for s in socks[0::2]), 6)
    finally:
        for s in socks:
            s.close()


def test_emfile_backs_off_instead_of_spinning(manifest_path, pool_path) -> None:
    # Few descriptors and a high connection cap: accept() runs out of descriptors first.
    with start_mds(manifest_path, pool_path, "--tcp-max-connections", "1000", "--tcp-idle-timeout", "60",
                   nofile=48) as m:  # fmt: skip
        good = connect(m.tcp, timeout_s=5)
        flood = [s for s in (_open(m.port) for _ in range(80)) if s is not None]
        try:
            time.sleep(0.5)  # the flood is in the listen backlog; accept() fails with EMFILE
            cpu0, t0 = m.cpu_s(), time.monotonic()
            time.sleep(1.5)
            busy = (m.cpu_s() - cpu0) / (time.monotonic() - t0)
            assert busy < 0.6, f"the server spins at {busy:.0%} of a core while out of descriptors"
            assert good.ping(b"alive") == b"alive"
        finally:
            for s in flood:
                s.close()
        assert until(lambda: m.stats()["tcp"]["accept_backoffs"] > 0, 10)
        # descriptors back: new connections are accepted again
        late = None
        for _ in range(40):
            with contextlib.suppress(Exception):
                late = connect(m.tcp, timeout_s=2)
                break
            time.sleep(0.1)
        assert late is not None and late.ping(b"back") == b"back"
        late.close()
        pool = PoolMapping.open(pool_path)
        well_behaved_round_trip(m.cxl(1), pool, b"emfile".ljust(32, b"."))
        pool.close()
        good.close()
        assert m.proc.poll() is None
    assert NS
