"""A connection flood of silent sockets that reconnect the moment the server closes one (the hostile
TCP tests' attacker: tests/hostile/test_flood_newcomers.py, test_soak_mixed.py)."""

from __future__ import annotations

import select
import socket
import threading
import time


def reconnecting_flood(port: int, want: int, stop: threading.Event, opened: list[int], pause_s: float = 0.02) -> None:
    """Hold `want` silent TCP connections to 127.0.0.1:`port`, opening a new one as soon as one is
    closed, until `stop`; `opened[0]` counts every connection opened."""
    socks: list[socket.socket] = []
    try:
        while not stop.is_set():
            if socks:
                readable, _, _ = select.select(socks, [], [], 0)
                for s in readable:
                    try:
                        closed = not s.recv(1)
                    except OSError:
                        closed = True
                    if closed:
                        socks.remove(s)
                        s.close()
            while len(socks) < want and not stop.is_set():
                try:
                    socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                except OSError:
                    break
                opened[0] += 1
            time.sleep(pause_s)
    finally:
        for s in socks:
            s.close()
