"""Admin HTTP for the metadata server: /healthz, /readyz, /metrics (Prometheus), /stats (JSON).

Runs in its own thread and reads only `server.snapshot` (refreshed by the server loop every
housekeeping tick, ~100 ms) plus plain integer counters, so it never races the index. Binds
127.0.0.1 unless told otherwise. The GETs are open; on an address beyond loopback every write
(any other method) must be signed with the rack secret (rpc/auth.py, bounded_http.WriteAuthHandler).
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.bounded_http import BoundedHTTPServer, WriteAuthHandler

if TYPE_CHECKING:
    from belugactl.dataplane.mds.server import MetadataServer

ADMIN_TIMEOUT_S = 5.0  # per request: reading it and writing the answer
ADMIN_MAX_CLIENTS = 16  # handler threads at once; more connections are closed at once
ADMIN_ACCEPT_BACKOFF_S = 0.2
ADMIN_POLL_S = 0.1  # how often the admin thread looks at its shutdown flag
# The whole request (a GET: its head) within this, however slowly it trickles in.
ADMIN_REQUEST_DEADLINE_S = 2.0


class _Collector:
    """Builds metric families from the snapshot at scrape time (no locks on the hot path)."""

    def __init__(self, server: MetadataServer) -> None:
        self.server = server

    def collect(self):  # -> Iterator[Metric]
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snap = self.server.snapshot
        idx = snap.get("index", {})
        req = snap.get("requests", {})
        tcp = snap.get("tcp", {})
        g = GaugeMetricFamily("beluga_mds_pool_bytes", "Shared KV area bytes by state", labels=["state"])
        g.add_metric(["used"], idx.get("bytes_used", 0))
        g.add_metric(["free"], idx.get("bytes_free", 0))
        g.add_metric(["reserved"], idx.get("bytes_reserved", 0))
        g.add_metric(["capacity"], idx.get("bytes_capacity", 0))
        yield g
        for name, help_, key in (
            ("beluga_mds_entries", "Committed blocks in the index", "entries"),
            ("beluga_mds_reservations", "Reservations waiting for commit", "reservations"),
            ("beluga_mds_leases", "Read leases outstanding", "leases"),
            ("beluga_mds_namespaces", "Namespaces opened", "namespaces"),
        ):
            gm = GaugeMetricFamily(name, help_)
            gm.add_metric([], idx.get(key, 0))
            yield gm
        for name, help_, value in (
            ("beluga_mds_evictions", "Blocks evicted (LRU above the high watermark)", idx.get("evictions", 0)),
            ("beluga_mds_evicted_bytes", "Bytes evicted", idx.get("evicted_bytes", 0)),
            (
                "beluga_mds_reservations_reclaimed",
                "Reservations reclaimed after their timeout",
                idx.get("reservations_reclaimed", 0),
            ),
            ("beluga_mds_pool_full", "Reservations refused for lack of space", idx.get("pool_full", 0)),
            ("beluga_mds_hits", "Lookups and GETs that found their first block", idx.get("hits", 0)),
            ("beluga_mds_misses", "Lookups and GETs that found nothing", idx.get("misses", 0)),
            ("beluga_mds_saved_bytes", "Bytes of blocks committed (saved into the pool)", idx.get("saved_bytes", 0)),
            (
                "beluga_mds_commits_checksummed",
                "Commits that carried the block's CRC32C (readers verify those blocks)",
                idx.get("commits_checksummed", 0),
            ),
            (
                "beluga_mds_leased_bytes",
                "Bytes of blocks leased to readers (loaded from the pool)",
                idx.get("leased_bytes", 0),
            ),
            ("beluga_mds_bad_slots", "CXL-RPC slots rejected (magic, sequence, length)", req.get("bad_slots", 0)),
            (
                "beluga_mds_foreign_refused",
                "COMMIT/ABORT/RELEASE of another ring's or connection's token or lease, refused",
                req.get("foreign_refused", 0),
            ),
            (
                "beluga_mds_batched_items",
                "Keys and tokens carried by RESERVE_MANY / COMMIT_MANY requests",
                req.get("batched_items", 0),
            ),
            ("beluga_mds_tcp_refused", "TCP connections closed over the cap", tcp.get("refused_over_cap", 0)),
            ("beluga_mds_tcp_closed_idle", "TCP connections closed after the idle timeout", tcp.get("closed_idle", 0)),
            ("beluga_mds_tcp_closed_oversize", "TCP connections closed: oversize frame", tcp.get("closed_oversize", 0)),
            ("beluga_mds_tcp_accept_backoffs", "accept() out of descriptors: pauses", tcp.get("accept_backoffs", 0)),
        ):
            c = CounterMetricFamily(name, help_)
            c.add_metric([], value)
            yield c
        ops = CounterMetricFamily("beluga_mds_ops", "Requests served, by opcode", labels=["op"])
        for op, n in req.get("by_op", {}).items():
            ops.add_metric([op.lower()], n)
        yield ops
        errs = CounterMetricFamily("beluga_mds_errors", "Error replies, by result code", labels=["code"])
        for code, n in req.get("errors_by_code", {}).items():
            errs.add_metric([code.lower()], n)
        yield errs
        transport = CounterMetricFamily("beluga_mds_requests", "Requests by transport", labels=["transport"])
        transport.add_metric(["cxl"], req.get("cxl", 0))
        transport.add_metric(["tcp"], req.get("tcp", 0))
        yield transport
        hist = HistogramMetricFamily(
            "beluga_mds_request_seconds", "Server-side service time per request", labels=["op"]
        )
        for op, h in snap.get("latency", {}).items():
            if not h["count"]:
                continue
            cumulative = 0
            buckets = []
            for bound, n in zip(h["buckets"], h["counts"], strict=False):
                cumulative += n
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", h["count"]))
            hist.add_metric([op.lower()], buckets, h["sum"])
        yield hist
        ep = GaugeMetricFamily("beluga_mds_epoch", "Pool epoch this server incarnation serves")
        ep.add_metric([], snap.get("epoch", 0))
        yield ep
        ready = GaugeMetricFamily("beluga_mds_ready", "1 when the server accepts index operations")
        ready.add_metric([], 1 if snap.get("ready") else 0)
        yield ready
        poison = snap.get("poison", {})  # mds/poison.py
        for name, help_, key in (
            ("beluga_mds_poisoned_ranges", "Poisoned pool ranges the server knows of", "ranges_known"),
            ("beluga_mds_quarantined_bytes", "KV bytes never allocated again (poisoned)", "bytes_quarantined"),
        ):
            gp = GaugeMetricFamily(name, help_)
            gp.add_metric([], poison.get(key, 0))
            yield gp
        dropped = CounterMetricFamily("beluga_mds_poison_dropped_blocks", "Blocks dropped for lying on poisoned lines")
        dropped.add_metric([], poison.get("blocks_dropped", 0))
        yield dropped
        from belugactl.dataplane.mds.admin_metrics import journal_metrics, loop_metrics, term_metrics

        yield from journal_metrics(snap)
        yield from loop_metrics(snap)
        from belugactl.dataplane.mds.tenant_metrics import tenant_metrics

        yield from tenant_metrics(snap)
        from belugactl.dataplane.mds.standby import leadership_metrics

        yield from leadership_metrics(snap.get("leadership"))  # elected through etcd: who leads, changes
        yield from term_metrics(snap)  # and this server's own terms


def _is_loopback(address: str) -> bool:
    import ipaddress

    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def post_poison(server: Any, httpd: Any, client: str, headers: Any, rfile: Any) -> tuple[int, dict[str, Any]]:
    """POST /poison: pool-relative poisoned ranges for the loop to apply (mds/poison.py). Loopback
    only, unless the admin server checks signed writes (then anyone holding the rack secret).
    A bounded body with a Content-Length, parsed whole before anything is queued."""
    from belugactl.dataplane.mds.poison import MAX_BODY, PoisonRequestError, parse_ranges

    if getattr(httpd, "write_verifier", None) is None and not _is_loopback(client):
        return 403, {"error": "POST /poison is taken from loopback only (no rack secret on this admin port)"}
    try:
        length = int(headers.get("Content-Length") or -1)
    except ValueError:
        length = -1
    if length < 0:
        return 411, {"error": "a Content-Length is required"}
    if length > MAX_BODY:
        return 413, {"error": f"the body is {length} bytes, over {MAX_BODY}"}
    body = rfile.read(length) if length else b""
    if len(body) != length:
        return 400, {"error": "the body ended early"}
    try:
        ranges = parse_ranges(body, server.geometry.pool_size)
    except PoisonRequestError as exc:
        return 400, {"error": str(exc)}
    queued = server.poison.submit(ranges, f"POST /poison from {client}")
    if ranges and not queued:
        return 503, {"error": "too many ranges waiting for the server loop: retry in a second"}
    return 200, {"queued": queued, "note": "applied by the server loop within a housekeeping tick; see /stats poison"}


class _AdminServer(BoundedHTTPServer):
    """Bounded threads, a whole-request deadline, slow clients give way (dataplane/bounded_http.py)."""

    max_clients = ADMIN_MAX_CLIENTS
    request_deadline_s = ADMIN_REQUEST_DEADLINE_S
    accept_backoff_s = ADMIN_ACCEPT_BACKOFF_S
    name = "metadata server: admin"


def start_admin(server: MetadataServer, bind: str, port: int) -> ThreadingHTTPServer:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(server))  # type: ignore[arg-type]

    class Handler(WriteAuthHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            return  # keep stderr for the server's own messages

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            httpd.request_read(self.connection)
            path = self.path.split("?", 1)[0]
            snap = server.snapshot
            if path == "/healthz":
                self._send(200, json.dumps({"status": "ok", "epoch": snap.get("epoch", 0)}).encode())
            elif path == "/readyz":
                ready, reason = server.readiness()
                body = {
                    "ready": ready,
                    "reason": reason,
                    "epoch": server.epoch,
                    "restart_policy": snap.get("restart_policy"),
                    "index": (
                        "rebuilt from the journal at start; the epoch fences older clients"
                        if snap.get("restart_policy") == "journal"
                        else "empty after every restart; the epoch fences older clients"
                    ),
                    "journal": snap.get("journal"),
                    "native_helper": snap.get("pool", {}).get("native_helper"),
                }
                self._send(200 if ready else 503, json.dumps(body).encode())
            elif path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/stats":
                self._send(200, json.dumps(snap, default=str, indent=2).encode())
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            if self.path.split("?", 1)[0] != "/poison":
                httpd.request_read(self.connection)
                self._send(404, b'{"error": "not found"}')
                return
            status, body = post_poison(server, httpd, self.client_address[0], self.headers, self.rfile)
            httpd.request_read(self.connection)
            if status != 200:
                self.close_connection = True  # a body left unread must not be taken for a request
            self._send(status, json.dumps(body).encode())

    Handler.timeout = ADMIN_TIMEOUT_S
    httpd = _AdminServer((bind, port), Handler)
    if server.auth_required(bind):  # writes beyond loopback are signed with the rack secret
        from belugactl.dataplane.rpc.auth import AdminVerifier

        httpd.write_verifier = AdminVerifier(server.rack_credential(True).key)
    # A stop waits for this thread's next look at its shutdown flag: 0.1 s, not the default 0.5 s, is
    # what keeps SIGTERM to exit under a second (docs/measurements.md, 2026-12-05, issue 31 item 3).
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": ADMIN_POLL_S}, name="mds-admin", daemon=True
    )
    thread.start()
    return httpd
