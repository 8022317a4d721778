"""Admin HTTP and pd-proxy under slow and oversized clients: a whole-request deadline, a thread
cap that slow clients give way under, bounded bodies, no traceback per aborted request."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from tests.hostile.conftest import start_mds, until

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(120)]


def _slowloris(host: str, port: int, n: int, stop: threading.Event) -> threading.Thread:
    """n connections each sending one byte of a request head every 0.5 s, reconnecting when cut."""

    def run() -> None:
        socks: list[socket.socket | None] = [None] * n
        while not stop.is_set():
            for i in range(n):
                try:
                    if socks[i] is None:
                        socks[i] = socket.create_connection((host, port), timeout=1)
                    socks[i].send(b"X")  # type: ignore[union-attr]
                except OSError:
                    socks[i] = None
            stop.wait(0.5)
        for s in socks:
            if s is not None:
                s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_slow_clients_do_not_lock_out_healthz(manifest_path, pool_path) -> None:
    with start_mds(manifest_path, pool_path) as m:
        host, port = m.record["admin"].removeprefix("http://").rsplit(":", 1)
        stop = threading.Event()
        t = _slowloris(host, int(port), 40, stop)  # more than the 16 handler threads
        try:
            time.sleep(2.5)  # every attacker connected, the first ones past the deadline
            # Before: 16 trickling connections held every thread and /healthz was refused.
            for _ in range(5):
                assert b'"status": "ok"' in m.admin("/healthz")
                time.sleep(0.2)
            assert m.ps.num_threads() < 40  # bounded threads while the attack runs
        finally:
            stop.set()
            t.join(5)
        m.proc.send_signal(signal.SIGTERM)
        err = m.stderr()
    assert "Traceback" not in err, err


def test_pd_proxy_bounds_threads_bodies_and_slow_clients() -> None:
    from belugactl.workflows.serve.pd_proxy import MAX_BODY, PdProxy, make_server

    proxy = PdProxy(["http://127.0.0.1:9"], ["http://127.0.0.1:9"])
    httpd = make_server(proxy, "127.0.0.1", 0)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    threads0 = threading.active_count()
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(200)]
        time.sleep(0.5)
        # Before: a thread per idle connection (200 idle connections, 201 threads).
        assert threading.active_count() <= threads0 + httpd.max_clients + 1
        for s in idle:
            s.close()
        assert until(lambda: threading.active_count() <= threads0 + 1, 10)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        assert s.recv(64).startswith(b"HTTP/1.1 413")
        s.close()
        assert until(lambda: b"ok" in _get(port, "/healthz"), 5)
    finally:
        httpd.shutdown()
        httpd.server_close()


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return s.recv(4096)
