"""A threaded HTTP server no client can take from the others (admin HTTP, pd-proxy).

- At most `max_clients` handler threads; a connection over the cap first takes the place of the
  oldest connection still sending its request after `evict_after_s` (a slowloris gives way),
  else it is closed at once.
- A whole-request deadline: a connection that has not sent its complete request (head and body)
  within `request_deadline_s` is shut down by one watchdog thread, however slowly it trickles
  bytes (a per-recv socket timeout alone restarts at every byte).
- A client that goes away or times out is not an error worth a traceback.
Handlers call `self.server.request_read(self.connection)` once they have the whole request.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connects waits in the backlog, not in SYN retries
    max_clients = 16
    request_deadline_s = 5.0
    evict_after_s = 0.05  # a request head arrives in one packet: one still arriving after this is slow
    accept_backoff_s = 0.2
    name = "http"

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(self.max_clients)
        self._lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # connection -> when it arrived, until its request is read
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        super().__init__(address, handler)
        self._closed = threading.Event()
        threading.Thread(target=self._watchdog, name=f"{self.name}-deadline", daemon=True).start()

    # --- who gets a thread ----------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        got = self._slots.acquire(blocking=False) or (self._evict_slowest() and self._slots.acquire(timeout=1.0))
        if not got:
            self.refused += 1
            self.shutdown_request(request)
            return
        with self._lock:
            self._reading[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self._lock:
            self._reading.pop(request, None)
        self._slots.release()

    def request_read(self, request: Any) -> None:
        """The handler has the whole request: the deadline no longer applies to it."""
        with self._lock:
            self._reading.pop(request, None)

    def _evict_slowest(self) -> bool:
        now = time.monotonic()
        with self._lock:
            slow = [(t, s) for s, t in self._reading.items() if now - t >= self.evict_after_s]
        if not slow:
            return False
        _t, sock = min(slow, key=lambda ts: ts[0])
        self.evicted += 1
        _shut(sock)
        return True

    def _watchdog(self) -> None:
        while not self._closed.wait(0.1):
            now = time.monotonic()
            with self._lock:
                late = [s for s, t in self._reading.items() if now - t > self.request_deadline_s]
                for s in late:
                    del self._reading[s]
            for s in late:
                self.timed_out += 1
                _shut(s)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    # --- quiet failures -------------------------------------------------------------------------
    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                time.sleep(self.accept_backoff_s)  # out of descriptors: wait, do not spin
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | ValueError):  # the client went away, timed out, or was cut off
            return
        print(f"{self.name}: request from {client_address[0]} failed: {exc!r}", file=sys.stderr)


def _shut(sock: socket.socket) -> None:
    """Unblock the handler thread reading from it (it then finishes and frees its place)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
