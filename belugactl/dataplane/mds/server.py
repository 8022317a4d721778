"""The metadata server process: one loop over its listeners, plus an admin HTTP thread.

What lives where:
  server.py        this loop, start-up order, readiness and the stats snapshot
  service.py       one decoded request in, one reply out (transport-free)
  index.py         keys -> extents, reservations, leases, eviction
  listener*.py     transports: listener_cxl.py (slot rings, native fast path), listener_tcp.py
  fencing.py       epochs and the quarantine of an earlier incarnation's reservations
  journal.py       the optional journal (restart policy "journal")
  ownership.py     tokens, lease ids and who may finish them
  admin.py         /healthz /readyz /metrics /stats

Start-up order (each step fails cleanly before the next changes anything shared):
  1. map and verify the pool (PoolMissing exit 3 / PoolMismatch exit 2)
  2. take the pool lock and bind every listener and the admin port (another server, or a port in
     use, is EnvironmentProblem, exit 3)
  3. bump the epoch in the pool header: every lease, reservation and request of an earlier
     incarnation is now fenced (its epoch no longer matches)
  4. listeners answer requests left from before the restart with STALE_EPOCH
  5. restart policy: start empty (default), or rebuild the index from the journal
  6. fencing: RESERVE is refused (NOT_READY) while a writer of the previous incarnation may still
     be writing an extent it reserved (fencing.py); optional `fence_grace_s` on top refuses
     every request but HELLO for that long (kept for operators who want it; not needed for safety)
  7. ready: /readyz says 200

The loop is single-threaded (the index needs no locks). It spins on the spinning listener (the
rings; GIL released in the native helper), drains the selector (TCP) every few requests, and
after `idle_after_s` without a request waits idle (woken at once by TCP, within `idle_poll_s` by CXL)
so an idle server does not burn a core; for `warm_after_s` after a request it looks every
`warm_poll_s` instead (the next burst of the same client is usually near), unless it never
busy-polls (`idle_after_s` 0: a host whose cores run the model). The idle wait is one native call
(RingListener.idle_wait) that looks at the rings between sleeps and wakes on the selector's fd, so an
idle server runs no Python until a request, a socket event or the housekeeping is due; the
requests the fast path handles (a pool hit's lookup) it answers in that same call, before any
Python runs.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from belugactl.dataplane import native
from belugactl.dataplane.mds.allocator import Allocator
from belugactl.dataplane.mds.fencing import Fencing
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.journal import gc_paused
from belugactl.dataplane.mds.listener import Listener, load_listeners
from belugactl.dataplane.mds.listener_tcp import TcpLimits, TcpListener, port_problem
from belugactl.dataplane.mds.loop_stats import LoopStats
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc.protocol import HEADER_SIZE
from belugactl.errors import PoolMismatch
from belugactl.pool.lock import ServerLock
from belugactl.pool.mapping import PoolMapping

RESTART_POLICIES = ("start-empty", "journal")
# Clear and sweep steps a housekeeping tick takes, at most this long (at least one step): progress when
# the loop's turns take none, without a tick's own pause growing with the work left.
HOUSEKEEPING_STEPS_S = 0.002
# While serving, the cyclic GC runs only between turns, on the young objects alone, once this many
# have piled up, and what survives is frozen at once: its automatic collections would come inside a
# request, and an older generation's walks every object made since the last freeze (tens of ms under
# a fill: docs/measurements.md, 2026-12-07).
GC_YOUNG = 20_000


def quiet_wait_s(cfg: ServerConfig, quiet_s: float, rings: bool) -> float:
    """How long the loop sleeps when the rings had nothing, `quiet_s` after the last request: not at
    all while busy-polling, `warm_poll_s` for `warm_after_s` after that, then `idle_poll_s`.

    Without a busy-poll (`idle_after_s` 0, `spin_after_ms: 0`) there are no warm looks either: that
    setting is for a host whose few cores run the model, and 10 000 wake-ups a second for 50 ms
    after every request land in the forward pass that follows a pool hit. On the CPU demo they cost
    it more than they saved the worker's release, which nobody waits for (it is sent without
    waiting: docs/measurements.md)."""
    if not rings or cfg.idle_after_s <= 0:
        return cfg.idle_poll_s
    if quiet_s <= cfg.idle_after_s:
        return 0.0
    if quiet_s <= cfg.idle_after_s + cfg.warm_after_s:
        return cfg.warm_poll_s
    return cfg.idle_poll_s


def idle_wait_timeout_s(cfg: ServerConfig, quiet_s: float, housekeeping_in_s: float) -> float:
    """How long one idle wait (RingListener.idle_wait) may last: until the housekeeping is due, and
    no later than the end of the warm looks it waits at (`quiet_wait_s`), whose rate then changes."""
    timeout = housekeeping_in_s
    if cfg.idle_after_s > 0 and quiet_s <= cfg.idle_after_s + cfg.warm_after_s:
        timeout = min(timeout, cfg.idle_after_s + cfg.warm_after_s - quiet_s)
    return max(0.0, timeout)


@dataclass
class ServerConfig:
    rpc_bind: str = "127.0.0.1"
    rpc_port: int | None = 9471  # None: no TCP listener
    admin_bind: str = "127.0.0.1"
    admin_port: int | None = 9470  # None: no admin HTTP
    fence_grace_s: float = 0.0
    index: IndexConfig = field(default_factory=IndexConfig)
    spin_ns: int = 200_000  # one native wait on the rings before looking at TCP and timers
    idle_after_s: float = 0.05
    # 0.25 ms: the idle wait looks at the rings in C (RingListener.idle_wait), far cheaper a look
    # than a turn of the Python loop, so it can look twice as often as the Python loop's 0.5 ms did
    # for less CPU (docs/measurements.md).
    idle_poll_s: float = 0.00025
    # Between busy-polling and the idle poll: for this long after the busy-poll ended (a client's
    # next burst usually follows within milliseconds: a lookup, then the worker's release) look
    # every warm_poll_s. Each look is cheap; a busy-poll would take a whole core.
    # Only after a busy-poll: with idle_after_s 0 the server only ever looks every idle_poll_s.
    warm_after_s: float = 0.05
    warm_poll_s: float = 0.0001
    housekeeping_s: float = 0.1
    fast_path: bool = True  # answer LOOKUP_PREFIX/GET/PING in the native helper when it is built
    restart_policy: str = "start-empty"  # or "journal": rebuild the index from the pool's journal area
    tcp: TcpLimits = field(default_factory=TcpLimits)
    listen: tuple[str, ...] = ()  # more listeners by URL, for transports registered beyond cxl and tcp
    # Seconds between reads of the pool device's poison lists (mds/poison.py); 0: never; None: the
    # manifest's serve.metadata.poison_check_s (open_server), else 60. Only a dax device pool has them.
    poison_check_s: float | None = None
    # The rack secret (rpc/auth.py): required of TCP RPC clients and admin writes on an address
    # beyond loopback ("auto"), or everywhere ("required": tests, and hosts that want it on loopback).
    secret_file: str | None = None  # None: no secret, so nothing that requires one can start
    auth: str = "auto"


class MetadataServer:
    def __init__(self, pool: PoolMapping, config: ServerConfig | None = None) -> None:
        self.pool = pool
        self.config = config or ServerConfig()
        g = pool.geometry
        self.geometry = g
        self.flush = pool.needs_flush
        self.max_payload = g.slot_size - HEADER_SIZE
        self.allocator = Allocator(g.shared_kv_offset, g.shared_kv_size)
        self.index = KVIndex(self.allocator, self.config.index, zero=pool.zero)
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._ready_at = float("inf")
        self.epoch = 0
        self.service = MetadataService(self.index, epoch=0, ready=False)
        self.service.rings = g.ring_count  # owners below are rings (tenants: from the manifest)
        self.index.set_rings(g.ring_count)  # the native fast path's lease room (mds/quotas.py)
        self.fencing = Fencing(pool, g, self.service, self.config.index.reservation_ttl_s)
        self.admin = None
        self.admin_port: int | None = None
        self.selector = selectors.DefaultSelector()  # selector listeners register here
        self._lock: ServerLock | None = None
        self.snapshot: dict[str, Any] = {}
        self.keeper: Any = None  # journal.JournalKeeper under restart policy "journal"
        self.listeners: list[Listener] = []
        for cls in load_listeners().values():
            self.listeners.extend(cls.from_config(self))
        self.ring: Any = next((lst for lst in self.listeners if lst.spins), None)
        from belugactl.dataplane.mds.poison import PoisonWatch

        self.poison = PoisonWatch(self.index, g)  # poisoned lines: quarantined, blocks on them dropped
        self.poison_checker: Any = None  # poison.PoisonChecker, on a dax device pool
        self.loop = LoopStats()  # the loop's own pause figures (mds/loop_stats.py)
        self._waited = 0.0  # the loop's deliberate waits since the last look at the rings
        if self.ring is not None and hasattr(self.ring, "serve_taken"):
            self._time_requests(self.ring)
        self._credential: Any = None
        self._credential_loaded = False
        # Elected through etcd (mds/standby.py): a leadership.Elector whose deadline the loop checks
        # before each turn's writes; past it (or the pool epoch bumped by another) the server steps
        # down and writes nothing more, not even its fence line at close.
        self.leadership: Any = None
        self.stepped_down = ""
        # A warm standby's journal_follow.JournalFollower whose copy of the index this server starts
        # with (finished by the standby after winning): start() journals on instead of rebuilding.
        self.follower: Any = None

    # --- who must authenticate (rpc/auth.py) ------------------------------------------------------
    def auth_required(self, bind: str) -> bool:
        """A listener on `bind` requires the handshake: beyond loopback, or when the policy says so."""
        from belugactl.dataplane.rpc.auth import is_loopback

        return self.config.auth == "required" or not is_loopback(bind)

    def rack_credential(self, required: bool) -> Any:
        """The rack secret (created when required and missing); None when not required and absent.
        Required without a secret file configured is a usage error (exit 2)."""
        from belugactl.dataplane.rpc.auth import load_rack_secret
        from belugactl.errors import UsageError

        path = self.config.secret_file
        if self._credential is None and path and (required or not self._credential_loaded):
            self._credential = load_rack_secret(path, create=required)
            self._credential_loaded = True
        if required and self._credential is None:
            raise UsageError(
                "an endpoint beyond loopback needs the rack secret, and this server has none",
                why="clients beyond loopback must prove the rack secret, and the server must prove it to them",
                fix="set serve.metadata.secret_file (setup creates it), or bind 127.0.0.1",
            )
        return self._credential

    def _time_requests(self, ring: Any) -> None:
        """Count each request the ring listener answers in Python as one turn of the loop."""
        inner = ring.serve_taken
        loop = self.loop
        clock = time.perf_counter

        def serve_taken(t: Any) -> int:
            t0 = clock()
            try:
                return inner(t)
            finally:
                took = clock() - t0
                loop.turn(took, "request")
                if took >= loop.longest_s:
                    loop.longest_what = f"request op {t[4]}"

        ring.serve_taken = serve_taken

    # --- the pool lock: the one place the server opens the pool a second time -------------------
    def _lock_pool(self) -> None:
        """One metadata server per pool (per host): a second one would bump the epoch under the first."""
        if self.leadership is not None:  # etcd decides who serves; a plain server is still kept out
            from belugactl.dataplane.mds.standby import elected_server_lock

            self._lock = elected_server_lock(self.pool.path)
            return
        self._lock = self.pool.server_lock()

    def _unlock_pool(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- start-up -----------------------------------------------------------------------------
    def bind(self) -> None:
        c = self.config
        self._lock_pool()
        try:
            for listener in self.listeners:
                listener.bind()
        except BaseException:
            self.close()
            raise
        if c.admin_port is not None:
            from belugactl.dataplane.mds.admin import start_admin

            if self.auth_required(c.admin_bind):
                try:
                    self.rack_credential(True)  # before the port opens: a missing secret is exit 2
                except BaseException:
                    self.close()
                    raise
            try:
                self.admin = start_admin(self, c.admin_bind, c.admin_port)
            except OSError as exc:
                self.close()
                raise port_problem(c.admin_bind, c.admin_port, "admin HTTP", exc) from None
            self.admin_port = self.admin.server_address[1]

    def start(self) -> None:
        """Bind, bump the epoch, fence what the previous incarnation left behind."""
        self.bind()
        previous = self.pool.epoch()
        self.epoch = self.pool.bump_epoch()
        self.service.epoch = self.epoch
        self.service.epoch32 = self.epoch & 0xFFFFFFFF
        for listener in self.listeners:
            listener.after_epoch()
        if self.config.restart_policy == "journal":
            from belugactl.dataplane.mds.journal import JournalKeeper

            g = self.geometry
            self.keeper = JournalKeeper(
                self.pool, g.journal_offset, g.journal_size, self.index, self.allocator, epoch=self.epoch
            )
            if self.follower is not None:  # a warm standby's index, in step with the journal
                self.keeper.take_over(self.follower)
            else:
                self.keeper.rebuild()
        self.fencing.start(previous)
        self._ready_at = time.monotonic() + self.config.fence_grace_s
        self.service.ready = self.is_ready()
        self._start_poison_check()
        self.publish_snapshot()

    def _start_poison_check(self) -> None:
        """The periodic read of the pool device's poison lists (a thread; the loop applies them)."""
        interval = self.config.poison_check_s
        interval = 60.0 if interval is None else interval
        if interval <= 0 or not self.pool.is_devdax:
            return
        from belugactl.dataplane.mds.poison import PoisonChecker
        from belugactl.pool.poison_reading import device_poison_reader

        reader = device_poison_reader(self.pool.path)
        if reader is not None:
            self.poison_checker = PoisonChecker(self.poison, reader, interval)
            self.poison_checker.start()

    def is_ready(self) -> bool:
        return time.monotonic() >= self._ready_at and not self._stop.is_set()

    def readiness(self) -> tuple[bool, str]:
        if self._stop.is_set():
            return False, "shutting down"
        if self.epoch == 0:
            return False, "starting"
        left = self._ready_at - time.monotonic()
        if left > 0:
            return False, f"fencing grace period: {left:.1f} s left"
        if self.keeper is not None and self.keeper.stopped:
            # Requests are still answered; what fails is the promise of restart policy "journal".
            return False, (
                f"journal stopped: {self.keeper.stopped}; the index will not survive a restart "
                "(doctor's metadata.journal says what to do)"
            )
        quarantine = self.fencing.remaining()
        if quarantine > 0:
            return True, f"ready (RESERVE fenced for {quarantine:.1f} s: writers of the previous epoch)"
        if self.poison.note:  # poisoned lines on the header, rings or journal: ready, but said loudly
            return True, f"ready; {self.poison.note}"
        return True, "ready"

    # --- the loop -----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def fenced_out(self, epoch: bool = False) -> bool:
        """Elected, and no longer certainly the leader: stop before any write (mds/leadership.py).
        `epoch`: also read the pool's epoch word (housekeeping; the loop's turns read the clock only)."""
        lead = self.leadership
        if lead is None or self.stepped_down:
            return bool(self.stepped_down)
        if not lead.holds():
            self.stepped_down = lead.lost_reason or "the leader's deadline passed"
        elif epoch and self.epoch and self.pool.epoch() != self.epoch:
            self.stepped_down = f"the pool epoch moved on to {self.pool.epoch()} (another leader fenced this one)"
        else:
            return False
        self._stop.set()
        return True

    def serve_forever(self) -> None:
        # Every lookup makes a few small objects (a lease, its list): the cyclic GC runs between turns
        # instead (`collect_young`), never over the index.
        gc.freeze()
        with gc_paused():
            self._serve_forever()

    def collect_young(self) -> None:
        """The cyclic GC's work, a bounded step between turns: the young generation once it holds
        GC_YOUNG objects, then its survivors frozen (never walked again)."""
        if gc.get_count()[0] >= GC_YOUNG:
            gc.collect(0)
            gc.freeze()

    def _serve_forever(self) -> None:
        cfg = self.config
        ring = self.ring
        idle_wait = getattr(ring, "idle_wait", None)  # a listener that can wait for its requests without a core
        lead = self.leadership
        if lead is not None:
            # The native idle wait looks at the rings once more after a pause (SIGSTOP) before it
            # looks at the clock: an elected server waits in Python, checking its deadline first.
            idle_wait = None
        selector_fd = self.selector.fileno() if hasattr(self.selector, "fileno") else -1
        others = [lst for lst in self.listeners if lst is not ring]
        served_since_poll = 0
        last_request = time.monotonic()
        next_housekeeping = 0.0
        woke = False  # the last idle wait ended early (a ready slot or socket)
        loop = self.loop
        clock = time.perf_counter
        look_end = clock()
        while not self._stop.is_set():
            if lead is not None and self.fenced_out():
                break
            # The loop's own work since its last look at the rings, less its deliberate waits.
            look_start = clock()
            loop.turn(look_start - look_end - self._waited)
            self._waited = 0.0
            idle = time.monotonic() - last_request > cfg.idle_after_s
            # With selector clients connected (or a clear or a sweep to finish), spin in shorter stretches so
            # their requests wait less.
            busy = any(lst.busy for lst in others) or self.index.background or self.poison.busy
            spin = 0 if idle else (min(cfg.spin_ns, 20_000) if busy else cfg.spin_ns)
            served = ring.serve(spin) if ring is not None else 0
            look_end = clock()
            if not served and not spin and ring is not None:
                loop.ring_pass(look_end - look_start)  # one look at every ring that found nothing
            if not served:
                now = time.monotonic()
                wait = quiet_wait_s(cfg, now - last_request, ring is not None)
                if idle_wait is not None and wait > 0 and not busy and not woke:
                    # No socket client to answer quickly: sleep between looks at the rings in C
                    # until a ring has a request, the selector has an event (a TCP connection), or
                    # the housekeeping is due, with no turn of this loop in between (each costs CPU
                    # on the cores the model runs on).
                    timeout = idle_wait_timeout_s(cfg, now - last_request, next_housekeeping - now)
                    loop.turn(clock() - look_end - self._waited)
                    got, answered = idle_wait(wait, timeout, selector_fd)
                    look_end = clock()
                    self._waited = 0.0
                    woke = got != -1
                    if answered:  # answered in the idle wait, bookkept: a request as any other
                        served_since_poll += answered
                        last_request = time.monotonic()
                    if got == -2:
                        self.poll_selector(0)
                else:
                    # Also after an idle wait that ended early on a slot or a socket that the turn then
                    # left alone: never a busy loop on something that stays ready.
                    woke = False
                    self.poll_selector(wait, busy)
                now = time.monotonic()
                if now >= next_housekeeping:
                    self.housekeeping()
                    next_housekeeping = now + cfg.housekeeping_s
                continue
            served_since_poll += served
            woke = False
            last_request = time.monotonic()
            if served_since_poll >= 32:
                served_since_poll = 0
                ring.rotate()  # fairness between rings
                self.poll_selector(0)
                now = time.monotonic()
                if now >= next_housekeeping:
                    self.housekeeping()
                    next_housekeeping = now + cfg.housekeeping_s
        self.close()

    def poll_selector(self, timeout: float, tcp_clients: bool = False) -> None:
        """Serve ready sockets, waiting at most `timeout` for one. With TCP clients connected, wait in
        epoll: a request wakes it at once (epoll counts whole milliseconds, so the rings then wait
        up to 1 ms). Without, a wait under a millisecond is a zero-timeout look and a sleep, so the
        rings wait only `timeout` (a new connection waits that long to be accepted)."""
        self.between_turns()
        if self.index.background or any(lst.backlog for lst in self.listeners):
            timeout = 0  # work is waiting: look at the sockets, do not sleep
        clock = time.perf_counter
        t0 = clock()
        if not self.selector.get_map():
            if timeout:
                time.sleep(timeout)
                self._waited += clock() - t0
            return
        if 0 < timeout < 0.001 and self.ring is not None and not tcp_clients:
            events = self.selector.select(0)
            if not events:
                time.sleep(timeout)
                events = self.selector.select(0)
        else:
            events = self.selector.select(timeout)
        if timeout:
            self._waited += clock() - t0  # a wait, not a pause (the dispatch below is work)
        for key, mask in events:
            key.data(mask)

    def between_turns(self) -> None:
        """Work that waits for a turn, a bounded step of each: clients over their per-turn budget,
        then a step of a namespace clear, the watermark sweep or the journal's compaction (the rings
        were served before this, and are after)."""
        if self.leadership is not None and self.fenced_out():
            return
        self.collect_young()
        for lst in self.listeners:
            if lst.backlog:
                lst.serve_backlog()
        if self.index.background:
            self.index.background_step()  # a step of a clear, the watermark sweep or the compaction
        if self.poison.busy:
            self.poison.step()  # poisoned ranges: quarantine, then a bounded slice of the scan

    def poll_once(self, timeout_ns: int = 0) -> bool:
        """Serve at most one ring request (tests drive the server with this, without a loop)."""
        return self.ring.poll_once(timeout_ns)

    def housekeeping(self) -> None:
        if self.leadership is not None and self.fenced_out(epoch=True):
            return  # the loop ends at its next turn; nothing of this housekeeping may write
        # What survived to this tick joins the frozen generation (O(1), a list splice): the cyclic
        # GC's full collections would otherwise walk every entry of the index (a pause of a second
        # per few million blocks, every few hundred thousand commits), and so would the collection
        # at the interpreter's exit. Cyclic garbage younger than the last young collection is kept.
        gc.freeze()
        # A clear or a sweep also makes progress here, whatever path the loop takes between turns.
        until = time.perf_counter() + HOUSEKEEPING_STEPS_S
        while self.index.background and self.index.background_step() and time.perf_counter() < until:
            pass
        self.service.ready = self.is_ready()
        self.fencing.refresh()
        for _ in range(8):  # the poison scan also makes progress here, like a clear
            if not self.poison.busy or not self.poison.step():
                break
        self.index.expire()
        self.fencing.idle(len(self.index.pending))  # nothing open: a crash now needs no quarantine
        now = time.monotonic()
        for listener in self.listeners:
            listener.housekeeping(now)
        self.publish_snapshot()

    # --- what the admin thread reads ------------------------------------------------------------
    @property
    def tcp(self) -> TcpListener | None:
        return next((lst for lst in self.listeners if isinstance(lst, TcpListener)), None)

    @property
    def tcp_port(self) -> int | None:
        tcp = self.tcp
        return tcp.port if tcp is not None else None

    @property
    def restored_entries(self) -> int:
        return self.keeper.restored_entries if self.keeper is not None else 0

    @property
    def journal_note(self) -> str:
        return self.keeper.note if self.keeper is not None else ""

    def publish_snapshot(self) -> None:
        """A consistent copy of the numbers for the admin thread (which never touches the index)."""
        s = self.index.stats()
        ready, reason = self.readiness()
        ring = self.ring.stats() if self.ring is not None else {}
        tcp = self.tcp
        tcp_stats = tcp.stats() if tcp is not None else {"bind": self.config.rpc_bind, "port": None, "connections": 0}
        service = self.service
        self.snapshot = {
            "time": time.time(),
            "epoch": self.epoch,
            "ready": ready,
            "reason": reason,
            "restart_policy": self.config.restart_policy,
            "journal": self.keeper.stats() if self.keeper is not None else {
                "active": False, "restored_entries": 0, "records_written": 0, "compactions": 0, "note": "",
            },  # fmt: skip
            "fencing": {
                "reserve_quarantine_s": round(self.fencing.quarantine_s, 3),
                "reserve_quarantine_left_s": round(self.fencing.remaining(), 3),
                "writer_window_ms": service.writer_window_ms,
            },
            "uptime_s": round(time.monotonic() - self._started, 3),
            "pool": {
                "path": str(self.pool.path),
                "devdax": self.pool.is_devdax,
                "needs_flush": self.flush,
                "native_helper": native.AVAILABLE,
                "native_fast_path": bool(ring.get("native_fast_path")),
                "rings": self.geometry.ring_count,
                "slots_per_ring": self.geometry.slots_per_ring,
                "slot_size": self.geometry.slot_size,
            },
            "index": s,
            "requests": {
                "total": service.requests,
                "cxl": ring.get("requests", 0),
                "cxl_native_fast_path": ring.get("fast_requests", 0),
                "tcp": tcp_stats.get("requests", 0),
                "errors": service.error_count,
                "foreign_refused": self.index.counters.foreign_refused,
                "released_handed_over": service.released_granted_elsewhere,  # the stats' public name, kept
                "batched_items": service.batched_items,
                "bad_slots": ring.get("bad_slots", 0),
                "rings_resynced": ring.get("rings_resynced", 0),
                "stale_fenced_at_start": ring.get("stale_fenced_at_start", 0),
                "by_op": dict(service.ops),
                "errors_by_code": dict(service.errors),
            },
            "latency": {
                name: {"buckets": list(h.bounds), "counts": list(h.counts), "sum": h.total, "count": h.n}
                for name, h in service.latency.items()
            },
            "tcp": tcp_stats,
            "listeners": {lst.scheme: lst.stats() for lst in self.listeners if lst not in (tcp, self.ring)},
            "poison": self.poison.stats(),
            "loop": self.loop.stats(),
            "leadership": self.leadership.stats() if self.leadership is not None else None,
        }

    # --- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop: fence line, lock, listeners, admin. Nothing per entry: what must reach the pool (the
        journal, the fence line) is written when it happens or here; the index's objects are frozen
        and left to the process's exit (no teardown of millions of objects, no full collection)."""
        gc.freeze()
        if self.poison_checker is not None:
            self.poison_checker.stop()
        if self._lock is not None and self.epoch and not self.stepped_down:
            self.fencing.clean_shutdown(len(self.index.pending))
        self._unlock_pool()
        for listener in self.listeners:
            listener.close()
        if self.admin is not None:
            self.admin.shutdown()
            self.admin.server_close()
            self.admin = None

    def stats_json(self) -> str:
        return json.dumps(self.snapshot, indent=2, default=str)


def open_server(
    pool_path: str | os.PathLike[str],
    manifest: Any,
    config: ServerConfig | None = None,
) -> MetadataServer:
    """Map + verify the pool against the manifest, then build (not start) a server."""
    config = config or ServerConfig()
    if config.secret_file is None:
        from belugactl.dataplane.rpc.auth import secret_path

        config.secret_file = secret_path(manifest)
    if config is not None and config.poison_check_s is None:
        ms = getattr(getattr(manifest, "serve", None), "metadata", None)
        config.poison_check_s = float(getattr(ms, "poison_check_s", 60))
    pool = PoolMapping.open(pool_path, manifest)
    if pool.geometry.shared_kv_size < (2 << 20):
        pool.close()
        raise PoolMismatch(f"pool {pool_path} has no shared KV area", fix="give layout.shared_kv some space")
    server = MetadataServer(pool, config)
    set_tenants(server, manifest)
    return server


def set_tenants(server: MetadataServer, manifest: Any) -> None:
    """The manifest's tenants (`tenants:`, model/tenants.py) and which ring is whose, into the index."""
    plan = getattr(manifest, "tenant_plan", None)
    layout = server.pool.layout
    if plan is None or layout is None or not getattr(manifest, "tenants", None):
        return
    from belugactl.dataplane.mds.quotas import TenantSpec

    specs, ring_tenant = plan(layout)
    server.index.set_tenants([TenantSpec(**s) for s in specs], ring_tenant)
