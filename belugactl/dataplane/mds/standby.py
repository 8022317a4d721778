"""A metadata server elected through etcd: waits as a standby, serves while it leads, steps down.

`run_elected` is the whole life of `belugactl metadata-server --standby`:
1. Standby: no epoch is bumped, no ring or TCP request is answered, nothing is written to the pool.
   A warm standby (the default) maps the pool and keeps a copy of the leader's index in step with
   the journal (mds/journal_follow.py, from a thread: `WarmCopy`); `--cold-standby` maps nothing.
   The admin port answers /healthz 200, /readyz 503 ("standby: <member> leads"), /stats and
   /metrics (who leads, since when, leader changes, how warm the copy is). It polls the leader key
   (every TTL/10, at most 0.25 s).
2. The key is gone (the leader's lease lapsed, or it resigned on a clean stop): campaign. The loser
   goes on waiting.
3. The winner starts its keep-alive thread at once. A warm standby applies the journal's last
   records to its copy (the old leader stopped writing before its lease lapsed) and starts that
   server; a cold one (or a warm one whose copy was lost) builds a server and rebuilds the index
   from the journal. Then the existing start-up order: bind, bump the pool epoch (every ring client,
   lease and reservation of the old leader is void), journal on (restart policy "journal"), fence
   the old leader's writers (mds/fencing.py), serve the same rings.
4. The server loop checks the leader's deadline before each turn's writes (MetadataServer.fenced_out)
   and the pool epoch at each housekeeping. Past either it stops without another byte written to the
   pool (not even the fence line at close), closes its sockets, unmaps the pool and goes back to 1.
5. SIGTERM/SIGINT: the leader stops as any server does, then revokes its lease, so a standby takes
   over within one poll instead of one TTL.

Across hosts nothing but etcd decides who serves; on one host (the tests: two processes on one file
pool) elected servers share the pool's flock (`elected_server_lock`, LOCK_SH), so a paused leader
does not keep its standby out, while a plain `metadata-server` (LOCK_EX) and an elected one still
refuse each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from belugactl.dataplane.mds.journal_follow import JournalFollower
from belugactl.dataplane.mds.leadership import Elector, EtcdUnavailable
from belugactl.errors import EnvironmentProblem


class ElectedServerLock:
    """A shared flock on the pool: held by every elected server on this host, refused by a plain one."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def elected_server_lock(path: str | os.PathLike[str]) -> ElectedServerLock:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise EnvironmentProblem(
            f"a metadata server that is not elected through etcd is serving {path}",
            why="it holds the pool's lock alone; an elected server would bump the epoch under it",
            fix="stop it, and start every server of the pool with --standby and the same etcd",
        ) from None
    return ElectedServerLock(Path(path), fd)


def leadership_metrics(lead: dict[str, Any] | None):  # -> Iterator[Metric]
    """`beluga_mds_leader*` from the snapshot's "leadership" (nothing for a server not elected)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if not lead:
        return
    g = GaugeMetricFamily("beluga_mds_leader", "1 while this server leads the rack (etcd election)", labels=["member"])
    g.add_metric([str(lead.get("member"))], 1 if lead.get("leading") else 0)
    yield g
    info = GaugeMetricFamily(
        "beluga_mds_leader_since_seconds", "When the current leader won (Unix time), by its member name",
        labels=["leader"],
    )  # fmt: skip
    if lead.get("leader") is not None:
        info.add_metric([str(lead["leader"])], float(lead.get("leader_since") or 0))
    yield info
    c = CounterMetricFamily("beluga_mds_leader_changes", "Leader changes this server saw since it started")
    c.add_metric([], lead.get("leader_changes", 0))
    yield c
    d = GaugeMetricFamily(
        "beluga_mds_leader_deadline_seconds", "Seconds this leader may still serve without another keep-alive"
    )
    d.add_metric([], lead.get("deadline_in_s") or 0)
    yield d


def warm_metrics(follow: dict[str, Any] | None):  # -> Iterator[Metric]
    """`beluga_mds_standby_*`: how warm a standby's copy of the index is (nothing for a cold one)."""
    from prometheus_client.core import GaugeMetricFamily

    if not follow:
        return
    yield GaugeMetricFamily(
        "beluga_mds_standby_warm", "1 while this standby's copy of the index follows the journal (a fast takeover)",
        value=1 if follow.get("warm") else 0,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "beluga_mds_standby_entries", "Entries in this standby's copy of the index", value=follow.get("entries", 0)
    )


RETRY_S = 5.0  # a lost copy is rebuilt after this long


class WarmCopy:
    """A warm standby's copy of the index: a server built (never started) and its JournalFollower,
    made and kept in step from a thread while the process stands by; `take()` at the takeover."""

    def __init__(
        self, make_server: Callable[[], Any], poll_s: float, on_warm: Callable[[dict[str, Any]], None]
    ) -> None:
        self.make_server = make_server
        self.poll_s = poll_s
        self.on_warm = on_warm
        self.server: Any = None
        self.follower: JournalFollower | None = None
        self.error = ""
        self.dropped = 0  # copies lost and rebuilt
        self.started = time.monotonic()
        self._stop = threading.Event()
        name = "metadata server: standby follows the journal"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Build a copy and follow; a copy that is lost (the journal stopped, a disagreement) is
        dropped and a fresh one built after RETRY_S, so the standby is warm again once it can be."""
        while not self._stop.is_set():
            try:
                self.server = self.make_server()
                self.follower = JournalFollower(self.server)
                self.follower.run(self._stop, self.poll_s, self._warm)
            except Exception as exc:  # noqa: BLE001 - the cold takeover meets it again, and says it
                self.error = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            self.dropped += 1
            if self.follower is not None and self.follower.lost:
                self.error = f"copy dropped: {self.follower.lost}"
            self._close()
            self._stop.wait(RETRY_S)

    def _close(self) -> None:
        server, self.server, self.follower = self.server, None, None
        if server is not None:
            server.close()
            server.pool.close()

    def _warm(self) -> None:
        f = self.follower
        assert f is not None
        self.on_warm({"entries": len(f.index.entries), "took_s": round(time.monotonic() - self.started, 3)})

    def stats(self) -> dict[str, Any]:
        f = self.follower
        out: dict[str, Any] = f.stats() if f is not None else {"warm": False, "entries": 0}
        out["copies_dropped"] = self.dropped
        if self.error:
            out["error"] = self.error
        return out

    def take(self) -> Any:
        """Stop following, apply what is left and hand over the server; None when its copy cannot be
        used (lost, or never built): the caller builds a server and rebuilds cold."""
        self._stop.set()
        self._thread.join()
        f, server = self.follower, self.server
        if f is not None and f.finish():
            server.follower = f
            return server
        self.discard()
        return None

    def abandon(self) -> None:
        """The process is leaving: stop following, waiting at most a second for the step under way (a
        first sync of millions of entries takes seconds); the exit frees the copy."""
        self._stop.set()
        self._thread.join(timeout=1.0)

    def discard(self) -> None:
        self._stop.set()
        self._thread.join()
        self._close()


def _standby_admin(runner: ElectedRun, bind: str, port: int) -> Any:
    """/healthz, /readyz (503), /stats, /metrics while this process is a standby."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from belugactl.dataplane.bounded_http import BoundedHTTPServer, WriteAuthHandler

    class Collector:
        def collect(self):  # -> Iterator[Metric]
            yield from leadership_metrics(runner.elector.stats())
            yield from warm_metrics(runner.standby_stats().get("follow"))
            from belugactl.dataplane.mds.admin_metrics import term_metrics

            yield from term_metrics(runner.standby_stats())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]

    class Handler(WriteAuthHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            return

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            httpd.request_read(self.connection)
            path = self.path.split("?", 1)[0]
            stats = runner.standby_stats()
            if path == "/healthz":
                self._send(200, json.dumps({"status": "ok", "role": "standby", "epoch": 0}).encode())
            elif path == "/readyz":
                self._send(503, json.dumps({"ready": False, "reason": stats["reason"], "epoch": 0}).encode())
            elif path == "/stats":
                self._send(200, json.dumps(stats, indent=2, default=str).encode())
            elif path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            httpd.request_read(self.connection)
            self._send(503, b'{"error": "a standby serves nothing; ask the leader"}')

    class StandbyHTTP(BoundedHTTPServer):
        name = "metadata server: standby admin"

    httpd = StandbyHTTP((bind, port), Handler)
    threading.Thread(target=httpd.serve_forever, name="metadata server: standby admin", daemon=True).start()
    return httpd


class ElectedRun:
    """The standby/leader cycle of one process (see the module's docstring).

    `make_server()` maps the pool and builds a MetadataServer (open_server); `on_event(name, record)`
    prints each change of role (the CLI's start records)."""

    def __init__(
        self,
        elector: Elector,
        make_server: Callable[[], Any],
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        admin_bind: str = "127.0.0.1",
        admin_port: int | None = None,
        warm: bool = True,
    ) -> None:
        self.elector = elector
        self.make_server = make_server
        self.on_event = on_event
        self.admin_bind = admin_bind
        self.admin_port = admin_port
        self._stop = threading.Event()
        self.server: Any = None
        self.terms = 0
        self.started = time.time()
        self.last_error = ""
        self.warm = warm  # keep a copy of the index in step with the journal while standing by
        self.copy: WarmCopy | None = None

    def stop(self) -> None:
        self._stop.set()
        server = self.server
        if server is not None:
            server.stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def standby_stats(self) -> dict[str, Any]:
        lead = self.elector.stats()
        who = lead.get("leader")
        reason = f"standby: {who} leads" if who else "standby: no leader yet, campaigning"
        if self.last_error:
            reason += f" ({self.last_error})"
        return {
            "time": time.time(),
            "role": "standby",
            "ready": False,
            "reason": reason,
            "epoch": 0,
            "leadership": lead,
            "uptime_s": round(time.time() - self.started, 3),
            "follow": self.copy.stats() if self.copy is not None else None,
        }

    def run(self) -> None:
        admin = None
        try:
            while not self._stop.is_set():
                if admin is None and self.admin_port is not None:
                    admin = _standby_admin(self, self.admin_bind, self.admin_port)
                    self.admin_port = admin.server_address[1]  # a port picked by the kernel stays this one's
                    with contextlib.suppress(EtcdUnavailable):
                        self.elector.observe()  # so /readyz names the leader from the "standby" record on
                    self.on_event("standby", {"admin": f"http://{self.admin_bind}:{self.admin_port}"})
                if self.warm and self.copy is None:
                    poll = min(0.25, self.elector.ttl_s / 10)
                    self.copy = WarmCopy(self.make_server, poll, lambda info: self.on_event("warm", info))
                if not self._campaign():
                    continue
                if admin is not None:
                    admin.shutdown()
                    admin.server_close()
                    admin = None
                self._lead()
        finally:
            if admin is not None:
                admin.shutdown()
                admin.server_close()
            if self.copy is not None:
                self.copy.abandon()  # not joined: SIGTERM ends a standby at once, whatever it follows
                self.copy = None
            self.elector.resign()

    def _campaign(self) -> bool:
        e = self.elector
        if not e.wait_for_vacancy(self._stop):
            return False
        try:
            won = e.campaign()
        except EtcdUnavailable as exc:
            self.last_error = str(exc)
            self._stop.wait(min(0.25, e.ttl_s / 10))
            return False
        self.last_error = ""
        return won and not self._stop.is_set()

    def _lead(self) -> None:
        """One term: keep the lease alive, start the server (epoch bump, journal), serve, step down."""
        e = self.elector
        e.start_keepalive()
        won_at = time.monotonic()
        server = None
        copy, self.copy = self.copy, None
        try:
            server = copy.take() if copy is not None else None
            if server is None:
                server = self.make_server()
            server.leadership = e
            if self.admin_port is not None:
                server.config.admin_port = self.admin_port
            self.server = server
            if self._stop.is_set():
                return
            server.start()
            self.terms += 1
            warm = getattr(server, "follower", None) is not None
            self.on_event("started", {"server": server, "took_s": round(time.monotonic() - won_at, 3), "warm": warm})
            server.serve_forever()
        finally:
            self.server = None
            if server is not None:
                server.close()
                server.pool.close()
            e.stop_keepalive()
            stepped = server.stepped_down if server is not None else ""
            if e.deadline:
                e.end_term(stepped or "stopped")
            if stepped:
                self.on_event("stepped-down", {"reason": stepped, "epoch": server.epoch})
