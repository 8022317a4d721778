"""The metadata server process: one loop serving CXL-RPC rings and TCP, plus an admin HTTP thread.

Start-up order (each step fails cleanly before the next changes anything shared):
  1. map and verify the pool (PoolMissing exit 3 / PoolMismatch exit 2)
  2. take the pool lock and bind the TCP and admin ports (another server, or a port in use, is
     EnvironmentProblem, exit 3)
  3. bump the epoch in the pool header: every lease, reservation and request of an earlier
     incarnation is now fenced (its epoch no longer matches)
  4. answer requests left in the rings from before the restart with STALE_EPOCH
  5. restart policy: start empty (default), or rebuild the index from the journal (mds/journal.py)
  6. fencing grace: for `fence_grace_s` every request but HELLO gets NOT_READY, so a writer of
     the previous incarnation that has not noticed the restart yet finishes (or fails its commit)
     before this server hands the same extents to someone else
  7. ready: /readyz says 200

Either way no entry of the previous incarnation is served unless it was committed and journaled.

The loop is single-threaded (the index needs no locks). It spins on the ring cursors through the
native helper (GIL released), drains TCP with a zero-timeout select every few requests, and after
`idle_after_s` without a request it sleeps in select() (woken at once by TCP, within
`idle_poll_s` by CXL) so an idle server does not burn a core.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import socket
import struct
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from belugactl.dataplane import native
from belugactl.dataplane.errors import PoolMismatch
from belugactl.dataplane.mds.allocator import Allocator
from belugactl.dataplane.mds.index import IndexConfig, KVIndex
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    REQ_READY,
    TCP_MAX_PAYLOAD,
    Code,
    Op,
    encode_get_reply,
)
from belugactl.errors import EnvironmentProblem
from belugactl.pool.lock import ServerLock
from belugactl.pool.mapping import PoolMapping

_FRAME = struct.Struct("<I")
RESTART_POLICIES = ("start-empty", "journal")


@dataclass
class ServerConfig:
    rpc_bind: str = "127.0.0.1"
    rpc_port: int | None = 9471  # None: no TCP listener
    admin_bind: str = "127.0.0.1"
    admin_port: int | None = 9470  # None: no admin HTTP
    fence_grace_s: float = 2.0
    index: IndexConfig = field(default_factory=IndexConfig)
    spin_ns: int = 200_000  # one native wait on the rings before looking at TCP and timers
    idle_after_s: float = 0.05
    idle_poll_s: float = 0.0005
    housekeeping_s: float = 0.1
    fast_path: bool = True  # answer LOOKUP_PREFIX/GET/PING in the native helper when it is built
    restart_policy: str = "start-empty"  # or "journal": rebuild the index from the pool's journal area


class _JournalHooks:
    """What the index calls on every commit and removal when the restart policy is "journal"."""

    def __init__(self, server: MetadataServer, journal: Any) -> None:
        self.server = server
        self.journal = journal

    def committed(self, e: Any) -> None:
        from belugactl.dataplane.mds.journal import encode_commit

        self._append(encode_commit(self.server.index.ns_names[e.key[0]], e.key[1], e.alloc.nbytes, e.alloc.blocks))

    def removed(self, e: Any) -> None:
        from belugactl.dataplane.mds.journal import encode_remove

        self._append(encode_remove(self.server.index.ns_names[e.key[0]], e.key[1]))

    def _append(self, body: bytes) -> None:
        from belugactl.dataplane.mds.journal import JournalFull

        index = self.server.index
        try:
            self.journal.append(body, lambda: list(index.entries.values()), index.ns_names)
        except JournalFull as exc:
            self.server._journal_off(f"{exc}; journaling disabled, the next start will be empty")


class _TcpConn:
    __slots__ = ("sock", "rx", "tx")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rx = bytearray()
        self.tx = bytearray()  # replies the client has not taken yet


# A client that stops reading its replies is dropped once this much is queued for it.
TCP_MAX_BACKLOG = 4 << 20


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
        self.tcp_listener: socket.socket | None = None
        self.tcp_port: int | None = None
        self.admin = None
        self.admin_port: int | None = None
        self._sel = selectors.DefaultSelector()
        self._lock: ServerLock | None = None
        self._conns: dict[int, _TcpConn] = {}
        self.snapshot: dict[str, Any] = {}
        self.stale_fenced = 0
        self.cxl_requests = 0
        self.tcp_requests = 0
        self.bad_slots = 0
        R = g.ring_count
        self._cursor = array("q", [0] * R)
        # The native wait watches 2R words: each ring's cursor slot, then each ring's slot 0
        # (where a (re)connecting client starts).
        self._offs = array("q", [g.slot_offset(r, 0) for r in range(R)] * 2)
        self._fast = None
        if self.config.fast_path and native.fast_serve is not None:
            self._fast = native.fi_new()
            self.index.attach_mirror(
                self._fast,
                native.fi_put,
                native.fi_del,
                lambda e: encode_get_reply(0, e.alloc.nbytes, e.alloc.extents),
            )
        self.fast_requests = 0
        self.rings_resynced = 0
        self.journal: Any = None
        self.journal_note = ""
        self.restored_entries = 0

    # --- start-up -----------------------------------------------------------------------------
    def _lock_pool(self) -> None:
        """One metadata server per pool (per host): a second one would bump the epoch under the first."""
        self._lock = self.pool.server_lock()

    def bind(self) -> None:
        c = self.config
        self._lock_pool()
        if c.rpc_port is not None:
            self.tcp_listener = _listen(c.rpc_bind, c.rpc_port, "RPC (TCP)")
            self.tcp_listener.setblocking(False)
            self.tcp_port = self.tcp_listener.getsockname()[1]
            self._sel.register(self.tcp_listener, selectors.EVENT_READ, None)
        if c.admin_port is not None:
            from belugactl.dataplane.mds.admin import start_admin

            try:
                self.admin = start_admin(self, c.admin_bind, c.admin_port)
            except OSError as exc:
                self.close()
                raise _port_problem(c.admin_bind, c.admin_port, "admin HTTP", exc) from None
            self.admin_port = self.admin.server_address[1]

    def start(self) -> None:
        """Bind, bump the epoch, fence what the previous incarnation left in the rings."""
        self.bind()
        self.epoch = self.pool.bump_epoch()
        self.service.epoch = self.epoch
        self.service.epoch32 = self.epoch & 0xFFFFFFFF
        self._fence_leftovers()
        if self.config.restart_policy == "journal":
            self._rebuild_from_journal()
        self._ready_at = time.monotonic() + self.config.fence_grace_s
        self.service.ready = self.is_ready()
        self.publish_snapshot()

    def _rebuild_from_journal(self) -> None:
        """Replay the journal into the (empty) index, compact it, and journal from now on."""
        from belugactl.dataplane.mds.journal import COMMIT, Journal, JournalFull

        g = self.geometry
        journal = Journal(self.pool, g.journal_offset, g.journal_size)
        live: dict[tuple[str, bytes], tuple[int, list[tuple[int, int]]]] = {}
        for rec in journal.read():
            if rec.kind == COMMIT:
                live[(rec.ns, rec.key)] = (rec.nbytes, [(int(s), int(o)) for s, o in rec.blocks or []])
            else:
                live.pop((rec.ns, rec.key), None)
        try:
            allocs = self.allocator.restore(list(live.values()))
        except ValueError as exc:
            self.journal_note = f"journal inconsistent ({exc}); started empty"
            allocs, live = [], {}
        self.index.restore([(ns, key, a) for (ns, key), a in zip(live, allocs, strict=True)])
        self.restored_entries = len(live)
        try:
            journal.rewrite(list(self.index.entries.values()), self.index.ns_names)
        except JournalFull as exc:
            self._journal_off(f"{exc}; journaling disabled")
            return
        self.journal = journal
        self.index.journal = _JournalHooks(self, journal)

    def _journal_off(self, why: str) -> None:
        """Stop journaling and invalidate the journal on media: a stale one could restore blocks
        whose space was handed out again after it stopped."""
        from belugactl.dataplane.mds.journal import MAGIC

        self.pool.write(self.geometry.journal_offset, bytes(len(MAGIC)))
        self.index.journal = None
        self.journal = None
        self.journal_note = why

    def _fence_leftovers(self) -> None:
        g = self.geometry
        for r in range(g.ring_count):
            ready = []
            for s in range(g.slots_per_ring):
                off = g.slot_offset(r, s)
                if native.load64(self.pool.buf, off) == REQ_READY:
                    _st, seq, magic, epoch, op, _c, _n = HEADER.unpack_from(self.pool.buf, off)
                    ready.append((seq, s, off, op))
            for seq, _s, off, op in sorted(ready):
                slots.reply(self.pool.buf, off, seq, self.service.epoch32, op, int(Code.STALE_EPOCH), b"", self.flush)
                self.stale_fenced += 1
            self._set_cursor(r, 0)

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
        return True, "ready"

    # --- the loop -----------------------------------------------------------------------------
    def _set_cursor(self, ring: int, slot: int) -> None:
        self._cursor[ring] = slot
        self._offs[ring] = self.geometry.slot_offset(ring, slot)

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        # Every lookup makes a few small objects (a lease, its list); with the default thresholds
        # the cyclic GC would walk the whole index hundreds of times a second under load.
        gc.freeze()
        gc.set_threshold(100_000, 50, 50)
        cfg = self.config
        buf = self.pool.buf
        offs = self._offs
        R = self.geometry.ring_count
        maxp = self.max_payload
        flush = self.flush
        take = slots.take
        serve = self._serve
        fast = self._fast_burst if self._fast is not None else None
        start = 0
        served_since_tcp = 0
        last_request = time.monotonic()
        next_housekeeping = 0.0
        while not self._stop.is_set():
            idle = time.monotonic() - last_request > cfg.idle_after_s
            # With TCP clients connected, spin in shorter stretches so their requests wait less.
            spin = 0 if idle else (cfg.spin_ns if not self._conns else min(cfg.spin_ns, 20_000))
            t = None
            if fast is not None and self.service.ready:
                served, stop = fast(start, spin)
                if served:
                    served_since_tcp += served
                    last_request = time.monotonic()
                if stop >= 0:
                    t = take(buf, offs, stop, maxp, 0, flush)
                elif not served:
                    t = None
                else:
                    t = False  # served a burst natively; fall through to the periodic work
            else:
                t = take(buf, offs, start, maxp, spin, flush)
            if t is None:
                now = time.monotonic()
                self._poll_tcp(cfg.idle_poll_s if idle else 0)
                if now >= next_housekeeping:
                    self.housekeeping()
                    next_housekeeping = now + cfg.housekeeping_s
                continue
            if t is not False:
                start = serve(t)
                served_since_tcp += 1
                last_request = time.monotonic()
            if served_since_tcp >= 32:
                served_since_tcp = 0
                start = start + 1 if start + 1 < R else 0  # fairness between rings
                self._poll_tcp(0)
                now = time.monotonic()
                if now >= next_housekeeping:
                    self.housekeeping()
                    next_housekeeping = now + cfg.housekeeping_s
        self.close()

    def _fast_burst(self, start: int, spin_ns: int) -> tuple[int, int]:
        """Let the native helper answer lookups/pings until something else shows up; (served, stop)."""
        index = self.index
        service = self.service
        hist = service.latency_by_op[Op.LOOKUP_PREFIX]
        assert hist is not None
        first_lease = index.next_lease
        served, stop, lease_next, log, lookups, hits, sum_ns, per_entry, gets = native.fast_serve(
            self._fast, self.pool.buf, self._offs, self._cursor, self.geometry.slots_per_ring,
            self.geometry.slot_size, service.epoch32, len(index.namespaces), self.flush, spin_ns,
            start, index.next_lease, 256, hist.bounds_ns, hist.counts,
        )  # fmt: skip
        if served:
            index.next_lease = lease_next
            granted = lease_next - first_lease
            if granted:  # before anything else can evict or delete
                index.apply_lease_burst(first_lease, lease_next - 1, granted, log, per_entry)
            index.counters.hits += hits + gets
            index.counters.misses += lookups - hits
            service.requests += served
            service._op_counts[Op.LOOKUP_PREFIX] += lookups
            service._op_counts[Op.GET] += gets
            service._op_counts[Op.PING] += served - lookups - gets
            hist.total += sum_ns / 1e9
            hist.n += lookups
            self.cxl_requests += served
            self.fast_requests += served
        return served, stop

    def poll_once(self, timeout_ns: int = 0) -> bool:
        """Serve at most one ring request (tests drive the server with this, without a loop)."""
        t = slots.take(self.pool.buf, self._offs, 0, self.max_payload, timeout_ns, self.flush)
        if t is None:
            return False
        self._serve(t)
        return True

    def _serve(self, t: slots.Taken) -> int:
        """Validate and answer one taken slot; return the ring to look at first next time."""
        i, seq, magic, epoch, op, _length, payload = t
        R = self.geometry.ring_count
        ring = i if i < R else i - R
        buf = self.pool.buf
        offs = self._offs
        if i >= R and self._cursor[ring] != 0:
            if native.load64(buf, offs[ring]) == REQ_READY:
                return ring  # the cursor slot is ready too: serve in order, slot 0 comes later
            self._set_cursor(ring, 0)  # a client (re)started its ring
        slot = self._cursor[ring]
        off = offs[ring]
        service = self.service
        t0 = time.perf_counter()
        if magic != MAGIC:
            code, rep = service.error(Code.BAD_MAGIC)
            self.bad_slots += 1
        elif seq % self.geometry.slots_per_ring != slot:
            code, rep = service.error(Code.BAD_SEQ)
            self.bad_slots += 1
        elif payload is None:
            code, rep = service.error(Code.BAD_LENGTH)
            self.bad_slots += 1
        else:
            code, rep = service.handle(op, epoch, payload, self.max_payload)
        slots.reply(buf, off, seq, service.epoch32, op & 0xFFFF, code, rep, self.flush)
        lat = service.latency_by_op
        if op < len(lat):
            h = lat[op]
            if h is not None:
                h.observe(time.perf_counter() - t0)
        self.cxl_requests += 1
        self._set_cursor(ring, slot + 1 if slot + 1 < self.geometry.slots_per_ring else 0)
        return ring

    def housekeeping(self) -> None:
        self.service.ready = self.is_ready()
        self.index.expire()
        self._resync_rings()
        self.publish_snapshot()

    def _resync_rings(self) -> int:
        """Safety net: a ring whose cursor slot is idle while other slots wait gets its cursor moved
        to the oldest waiting request (a client that pipelined after a reset without HELLO, or one
        that scribbled). Clients post in order, so this never reorders a well-behaved ring."""
        g = self.geometry
        buf = self.pool.buf
        moved = 0
        for r in range(g.ring_count):
            if native.load64(buf, self._offs[r]) == REQ_READY:
                continue
            waiting = []
            for slot in range(g.slots_per_ring):
                off = g.slot_offset(r, slot)
                if native.load64(buf, off) == REQ_READY:
                    waiting.append((HEADER.unpack_from(buf, off)[1], slot))
            if waiting:
                self._set_cursor(r, min(waiting)[1])
                moved += 1
        self.rings_resynced += moved
        return moved

    def publish_snapshot(self) -> None:
        """A consistent copy of the numbers for the admin thread (which never touches the index)."""
        s = self.index.stats()
        ready, reason = self.readiness()
        self.snapshot = {
            "time": time.time(),
            "epoch": self.epoch,
            "ready": ready,
            "reason": reason,
            "restart_policy": self.config.restart_policy,
            "journal": {
                "active": self.journal is not None,
                "restored_entries": self.restored_entries,
                "records_written": self.journal.records_written if self.journal else 0,
                "compactions": self.journal.compactions if self.journal else 0,
                "note": self.journal_note,
            },
            "uptime_s": round(time.monotonic() - self._started, 3),
            "pool": {
                "path": str(self.pool.path),
                "devdax": self.pool.is_devdax,
                "needs_flush": self.flush,
                "native_helper": native.AVAILABLE,
                "native_fast_path": self._fast is not None,
                "rings": self.geometry.ring_count,
                "slots_per_ring": self.geometry.slots_per_ring,
                "slot_size": self.geometry.slot_size,
            },
            "index": s,
            "requests": {
                "total": self.service.requests,
                "cxl": self.cxl_requests,
                "cxl_native_fast_path": self.fast_requests,
                "tcp": self.tcp_requests,
                "errors": self.service.error_count,
                "bad_slots": self.bad_slots,
                "rings_resynced": self.rings_resynced,
                "stale_fenced_at_start": self.stale_fenced,
                "by_op": dict(self.service.ops),
                "errors_by_code": dict(self.service.errors),
            },
            "latency": {
                name: {"buckets": list(h.bounds), "counts": list(h.counts), "sum": h.total, "count": h.n}
                for name, h in self.service.latency.items()
            },
            "tcp": {"bind": self.config.rpc_bind, "port": self.tcp_port, "connections": len(self._conns)},
        }

    # --- TCP ----------------------------------------------------------------------------------
    def _poll_tcp(self, timeout: float) -> None:
        if self.tcp_listener is None:
            if timeout:
                time.sleep(timeout)
            return
        for key, events in self._sel.select(timeout):
            if key.data is None:
                self._accept()
                continue
            if events & selectors.EVENT_WRITE:
                self._flush_tx(key.data)
            if events & selectors.EVENT_READ and key.data.sock.fileno() >= 0:
                self._read(key.data)

    def _accept(self) -> None:
        assert self.tcp_listener is not None
        try:
            sock, _addr = self.tcp_listener.accept()
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)  # never let one slow client stall the loop (and the CXL rings)
        conn = _TcpConn(sock)
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _TcpConn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        self._conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _flush_tx(self, conn: _TcpConn) -> None:
        try:
            sent = conn.sock.send(conn.tx)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        del conn.tx[:sent]
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.tx else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.modify(conn.sock, want, conn)

    def _read(self, conn: _TcpConn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        rx = conn.rx
        rx += data
        out = bytearray()
        perf = time.perf_counter
        while len(rx) >= 4:
            (size,) = _FRAME.unpack_from(rx, 0)
            if not HEADER_SIZE <= size <= HEADER_SIZE + TCP_MAX_PAYLOAD:
                self.service.error(Code.BAD_LENGTH)
                self._drop(conn)  # framing is lost: nothing after this can be trusted
                return
            if len(rx) < 4 + size:
                break
            _st, seq, magic, epoch, op, _code, length = HEADER.unpack_from(rx, 4)
            payload = bytes(rx[4 + HEADER_SIZE : 4 + size])
            del rx[: 4 + size]
            t0 = perf()
            if magic != MAGIC:
                code, rep = self.service.error(Code.BAD_MAGIC)
            elif length != size - HEADER_SIZE:
                code, rep = self.service.error(Code.BAD_LENGTH)
            else:
                code, rep = self.service.handle(op, epoch, payload, TCP_MAX_PAYLOAD)
            frame = bytearray(4 + HEADER_SIZE + len(rep))
            _FRAME.pack_into(frame, 0, HEADER_SIZE + len(rep))
            HEADER.pack_into(frame, 4, 0, seq, MAGIC, self.service.epoch32, op & 0xFFFF, code, len(rep))
            frame[4 + HEADER_SIZE :] = rep
            out += frame
            h = self.service.latency.get(self.service._names.get(op, ""))
            if h is not None:
                h.observe(perf() - t0)
            self.tcp_requests += 1
        if out:
            conn.tx += out
            if len(conn.tx) > TCP_MAX_BACKLOG:
                self._drop(conn)
                return
            self._flush_tx(conn)

    # --- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self.tcp_listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self.tcp_listener)
            self.tcp_listener.close()
            self.tcp_listener = None
        if self.admin is not None:
            self.admin.shutdown()
            self.admin.server_close()
            self.admin = None

    def stats_json(self) -> str:
        return json.dumps(self.snapshot, indent=2, default=str)


def _listen(bind: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise _port_problem(bind, port, what, exc) from None
    return sock


def _port_problem(bind: str, port: int, what: str, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"cannot listen for {what} on {bind}:{port}: {exc.strerror or exc}",
        why="another process holds the port, or the address is not on this host",
        fix=f"stop the other process (`ss -ltnp 'sport = :{port}'`) or pick another port",
    )


def open_server(
    pool_path: str | os.PathLike[str],
    manifest: Any,
    config: ServerConfig | None = None,
) -> MetadataServer:
    """Map + verify the pool against the manifest, then build (not start) a server."""
    pool = PoolMapping.open(pool_path, manifest)
    if pool.geometry.shared_kv_size < (2 << 20):
        pool.close()
        raise PoolMismatch(f"pool {pool_path} has no shared KV area", fix="give layout.shared_kv some space")
    return MetadataServer(pool, config)
