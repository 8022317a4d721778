"""A tiny stand-in for a vLLM instance behind the router: GET /health, and requests that say who answered.

usage: router_backend.py PORT NAME
  GET  /health        200
  GET  /who           200, body NAME
  GET  /slow?s=SEC    sleeps SEC seconds, then 200, body NAME (a long generation, holding its connection)
  GET  /hold          holds its connection until GET /let-go (at most 60 s), then 200, body NAME: a long
                      generation that lasts exactly as long as the test needs
  GET  /let-go        200: every /hold request on this instance answers now
  GET  /inflight      200, body: how many /slow and /hold requests this instance is in right now
  GET  /v1/models     the model list vLLM's OpenAI server gives (one model, "demo")
  POST /v1/completions  one token, as vLLM answers a token-id prompt; header X-Backend: NAME
  GET  /metrics       vLLM's prompt-token counter by source (zero)
  GET  /die-slowly?s=SEC  200, then stops accepting but keeps its listening socket for SEC seconds and
                      exits: how a killed vLLM dies (the kernel completes handshakes into the backlog while
                      the dying process tears its memory down, then resets them when its files close)
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
import urllib.parse

SERVER: http.server.ThreadingHTTPServer | None = None
INFLIGHT = [0]
INFLIGHT_LOCK = threading.Lock()
LET_GO = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    name = ""

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("X-Backend", self.name)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/health":
            self._answer(200, b"")
        elif url.path == "/who":
            self._answer(200, self.name.encode())
        elif url.path == "/slow":
            seconds = float(urllib.parse.parse_qs(url.query).get("s", ["1"])[0])
            with INFLIGHT_LOCK:
                INFLIGHT[0] += 1
            try:
                time.sleep(min(seconds, 30.0))
            finally:
                with INFLIGHT_LOCK:
                    INFLIGHT[0] -= 1
            self._answer(200, self.name.encode())
        elif url.path == "/hold":
            with INFLIGHT_LOCK:
                INFLIGHT[0] += 1
            try:
                LET_GO.wait(60.0)
            finally:
                with INFLIGHT_LOCK:
                    INFLIGHT[0] -= 1
            self._answer(200, self.name.encode())
        elif url.path == "/let-go":
            LET_GO.set()
            self._answer(200, b"")
        elif url.path == "/inflight":
            self._answer(200, str(INFLIGHT[0]).encode())
        elif url.path == "/die-slowly":
            seconds = float(urllib.parse.parse_qs(url.query).get("s", ["1"])[0])
            self._answer(200, b"dying")
            self.wfile.flush()
            threading.Thread(target=_die_slowly, args=(min(seconds, 30.0),), daemon=True).start()
        elif url.path == "/v1/models":
            self._answer(200, json.dumps({"data": [{"id": "demo"}]}).encode())
        elif url.path == "/metrics":
            self._answer(200, b'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 0.0\n')
        else:
            self._answer(404, b"")

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        answer = {"choices": [{"token_ids": [7]}], "usage": {"prompt_tokens": len(request.get("prompt", []))}}
        self._answer(200, json.dumps(answer).encode())

    def log_message(self, *args: object) -> None:
        return


def _die_slowly(seconds: float) -> None:
    assert SERVER is not None
    SERVER.shutdown()  # the accept loop ends; the listening socket stays open, so connections queue
    time.sleep(seconds)
    os._exit(1)  # closing the socket resets every queued connection


def main() -> None:
    global SERVER
    port, name = int(sys.argv[1]), sys.argv[2]
    Handler.name = name
    server = SERVER = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"backend {name} on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
