"""A small real process for supervisor tests: answers GET /health on a port, or misbehaves on purpose.

usage: fake_service.py PORT MODE [ARG]
  ok                serve until SIGTERM
  exit-now          exit 3 before listening
  crash-after S     serve for S seconds, then exit 1 (a crash after it was ready)
  ignore-term       serve and ignore SIGTERM (the supervisor must SIGKILL it)
"""

from __future__ import annotations

import http.server
import signal
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200 if self.path in ("/health", "/readyz") else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    print(f"fake service {mode} on {port}", flush=True)
    if mode == "exit-now":
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def on_term(signum: int, frame: object) -> None:
            print(f"stopping at {time.time():.6f}", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if mode == "crash-after":
        time.sleep(float(sys.argv[3]))
        sys.exit(1)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
