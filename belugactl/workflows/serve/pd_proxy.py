"""The front door for prefill/decode disaggregation (`serve.vllm.kv_roles`).

A request goes first to a producer instance (kv_producer, or kv_both) with `max_tokens: 1`: it
computes the prompt (loading whatever prefix the pool already holds) and saves every full block
before it answers (producers save synchronously). Then the original request goes to a consumer
(kv_consumer, or kv_both), which finds the prompt's full blocks in the pool, loads them, recomputes
the tail of the prompt that does not fill a block (always fewer than block_size tokens, plus the last
token that vLLM computes to sample from) and decodes. The consumer's answer, streamed or not, is the
client's answer.

The pool is a cache, so a failed prefill is not a failed request: the consumer then computes the
prompt itself (slower, same tokens); the failure is counted. Producers and consumers are taken
round-robin; an instance that refuses the connection is skipped for the next one.

HAProxy cannot do this (one request, two backends in sequence), so this is a small threaded HTTP
server of our own. It binds where serve.router says (loopback by default), caps request bodies, and
answers `/healthz` and `/metrics` (Prometheus text).
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from belugactl.dataplane.bounded_http import BoundedHTTPServer

# A prompt of a couple hundred thousand tokens, as JSON; buffered whole, so at most
# MAX_CLIENTS x this is held at once.
MAX_BODY = 4 << 20
MAX_CLIENTS = 64  # handler threads at once (dataplane/bounded_http.py: slow clients give way)
REQUEST_DEADLINE_S = 30.0  # the whole request, head and body, however slowly it arrives
READ_TIMEOUT_S = 10.0  # one read from the client
TIMEOUT_S = 600.0  # a generation can take minutes
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")


class _Upstream:
    """One vLLM instance: where it is, reached with http.client (streams relayed as they arrive)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"{url}: expected http://HOST:PORT")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)


class _RoundRobin:
    def __init__(self, upstreams: Sequence[_Upstream]) -> None:
        self.upstreams = list(upstreams)
        self._next = itertools.cycle(range(len(self.upstreams)))
        self._lock = threading.Lock()

    def order(self) -> list[_Upstream]:
        """Every instance once, starting with the next one in turn."""
        with self._lock:
            first = next(self._next)
        return self.upstreams[first:] + self.upstreams[:first]


class PdProxy:
    def __init__(self, producers: Sequence[str], consumers: Sequence[str], *, timeout_s: float = TIMEOUT_S) -> None:
        if not producers or not consumers:
            raise ValueError("a prefill/decode front door needs at least one producer and one consumer")
        self.producers = _RoundRobin([_Upstream(u) for u in producers])
        self.consumers = _RoundRobin([_Upstream(u) for u in consumers])
        self.timeout_s = timeout_s
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "beluga_pd_requests", "Requests through the prefill/decode front door", ["outcome"], registry=self.registry
        )
        self.prefill_failures = Counter(
            "beluga_pd_prefill_failures",
            "Prefills that failed (the consumer then computed the prompt itself)",
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "beluga_pd_phase_seconds",
            "Time of each phase of a request: prefill on a producer, decode on a consumer",
            ["phase"],
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def prefill(self, path: str, doc: dict[str, Any]) -> bool:
        """Run the prompt on a producer, one token; True once a producer answered 200."""
        body = dict(doc)
        body["max_tokens"] = 1
        if path.endswith("/chat/completions"):
            body["max_completion_tokens"] = 1
        body["stream"] = False
        body.pop("stream_options", None)
        body["n"] = 1
        data = json.dumps(body).encode()
        started = time.perf_counter()
        for upstream in self.producers.order():
            try:
                conn = upstream.connect(self.timeout_s)
                try:
                    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    reply.read()
                finally:
                    conn.close()
            except OSError:
                continue  # refused or reset: the next producer
            if reply.status == 200:
                self.phase_seconds.labels("prefill").observe(time.perf_counter() - started)
                return True
            break  # the producer understood and refused the request; another would too
        self.prefill_failures.inc()
        return False


def _handler(proxy: PdProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "belugactl-pd-proxy"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return  # the supervisor keeps stderr; one line per request would drown real problems

        def _reply(self, status: int, payload: dict[str, Any] | bytes, content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._reply(status, {"error": {"message": message, "type": "belugactl_pd_proxy", "code": status}})

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.server.request_read(self.connection)  # type: ignore[attr-defined]
            if self.path in ("/healthz", "/health"):
                self._reply(200, b"ok\n", "text/plain")
            elif self.path == "/metrics":
                self._reply(200, generate_latest(proxy.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/v1/models":
                self._relay("GET", self.path, None)
            else:
                self._error(404, f"{self.path}: not served here")

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in GENERATE_PATHS:
                self._error(404, f"{self.path}: this front door serves {', '.join(GENERATE_PATHS)}")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._error(411, "a Content-Length is required")
                return
            if not 0 <= length <= MAX_BODY:
                self.close_connection = True  # the body is not read: the connection cannot go on
                self._error(413, f"request body of {length} bytes; at most {MAX_BODY}")
                return
            raw = self.rfile.read(length)
            self.server.request_read(self.connection)  # type: ignore[attr-defined]
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                self._error(400, f"the body is not JSON: {exc}")
                return
            if not isinstance(doc, dict):
                self._error(400, "the body must be a JSON object")
                return
            proxy.prefill(self.path, doc)  # a failure is counted; the consumer then computes the prompt
            self._relay("POST", self.path, raw)

        def _relay(self, method: str, path: str, body: bytes | None) -> None:
            """Send to a consumer and pass its answer back as it comes (server-sent events included)."""
            started = time.perf_counter()
            for upstream in proxy.consumers.order():
                try:
                    conn = upstream.connect(proxy.timeout_s)
                    headers = {"Content-Type": "application/json"} if body is not None else {}
                    conn.request(method, path, body=body, headers=headers)
                    reply = conn.getresponse()
                except OSError:
                    continue
                if method == "POST":
                    # counted once the consumer's status is known, before the body goes back: a client that
                    # has its answer and then reads /metrics must already see its request there
                    proxy.requests.labels("ok" if reply.status == 200 else f"http_{reply.status}").inc()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.getheader("Content-Type", "application/json"))
                    length = reply.getheader("Content-Length")
                    if length is not None:
                        self.send_header("Content-Length", length)
                    else:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while chunk := reply.read1(65536):
                        if length is None:
                            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        else:
                            self.wfile.write(chunk)
                        self.wfile.flush()
                    if length is None:
                        self.wfile.write(b"0\r\n\r\n")
                finally:
                    conn.close()
                if method == "POST":
                    proxy.phase_seconds.labels("decode").observe(time.perf_counter() - started)
                return
            proxy.requests.labels("no_consumer").inc()
            self._error(502, "no consumer instance answered")

    return Handler


class _Server(BoundedHTTPServer):
    max_clients = MAX_CLIENTS
    request_deadline_s = REQUEST_DEADLINE_S
    name = "pd-proxy"


def make_server(proxy: PdProxy, bind: str, port: int) -> ThreadingHTTPServer:
    handler = _handler(proxy)
    handler.timeout = READ_TIMEOUT_S
    return _Server((bind, port), handler)
