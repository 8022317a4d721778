"""A threaded HTTP server no client can take from the others (admin HTTP, pd-proxy).

- At most `max_clients` handler threads; a connection over the cap first takes the place of the
  oldest connection still sending its request after `evict_after_s` (a slowloris gives way),
  else it is closed at once.
- A whole-request deadline: a connection that has not sent its complete request (head and body)
  within `request_deadline_s` is shut down by one watchdog thread, however slowly it trickles
  bytes (a per-recv socket timeout alone restarts at every byte).
- A client that goes away or times out is not an error worth a traceback.
Handlers call `self.server.request_read(self.connection)` once they have the whole request.

Writes (any method but GET and HEAD) on a server given a `write_verifier` (rpc/auth.py: an
endpoint bound beyond loopback) must be signed: `WriteAuthHandler` reads the body (at most
`max_write_body` bytes), checks the signature before any `do_POST` runs, and answers 401 (or
413) itself; the handler then reads the same body from `self.rfile` as usual.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    write_verifier: Any = None  # rpc/auth.py:AdminVerifier when writes must be signed
    max_write_body = 1 << 20
    writes_refused = 0

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


class WriteAuthHandler(BaseHTTPRequestHandler):
    """A request handler whose writes are checked against the server's `write_verifier` first."""

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        verifier = getattr(self.server, "write_verifier", None)
        if verifier is None or self.command in ("GET", "HEAD"):
            return True
        self.close_connection = True  # one signed write per connection: the body is read here
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        limit = getattr(self.server, "max_write_body", 1 << 20)
        if not 0 <= length <= limit:
            self._refuse(413, f"a write's body is 0..{limit} bytes with a Content-Length")
            return False
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            return False  # the client went away mid-body
        why = verifier.check(self.headers.get("Authorization"), self.command, self.path, body)
        if why is not None:
            self._refuse(401, why)
            return False
        self.rfile = io.BytesIO(body)  # the handler reads the body it expects, as if unread
        return True

    def _refuse(self, status: int, why: str) -> None:
        server = self.server
        server.writes_refused = getattr(server, "writes_refused", 0) + 1  # type: ignore[attr-defined]
        request_read = getattr(server, "request_read", None)
        if request_read is not None:
            request_read(self.connection)
        body = json.dumps({"error": why}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("WWW-Authenticate", "Beluga-HMAC")
        self.end_headers()
        self.wfile.write(body)


def _shut(sock: socket.socket) -> None:
    """Unblock the handler thread reading from it (it then finishes and frees its place)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
