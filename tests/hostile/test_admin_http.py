"""The admin HTTP server under idle and vanishing clients: bounded threads, timeouts, clean logs."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.hostile.conftest import start_mds, until

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


def test_idle_and_vanishing_admin_clients(manifest_path, pool_path) -> None:
    with start_mds(manifest_path, pool_path) as m:
        host, port = m.record["admin"].removeprefix("http://").rsplit(":", 1)
        threads0 = m.ps.num_threads()
        idle = [socket.create_connection((host, int(port)), timeout=2) for _ in range(40)]
        for i in range(20):  # clients that send half a request and vanish, or reset the connection
            s = socket.create_connection((host, int(port)), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"GET /stats HTTP/1.0\r\n\r\n")
            if i % 3 == 0:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        time.sleep(0.5)
        assert m.ps.num_threads() <= threads0 + 16 + 1  # bounded handler threads
        # Within the request timeout every idle connection is closed and the threads are gone.
        assert until(lambda: m.ps.num_threads() <= threads0 + 1, 10)
        for s in idle:
            s.close()
        assert until(lambda: b'"status": "ok"' in m.admin("/healthz"), 5)
        m.proc.send_signal(signal.SIGTERM)
        err = m.stderr()
    assert "Traceback" not in err, err
