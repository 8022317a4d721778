"""The CXL-RPC listener: polls the client slot rings in the pool's metadata area.

One ring per client; each ring's slots are used in order, so the listener watches one status
word per ring (the slot at its cursor) plus slot 0 of every ring (where a reconnecting client
starts). With the native helper built it lets C answer LOOKUP_PREFIX/GET/PING bursts straight
from the rings (`fast_serve`, GIL released) and takes everything else through Python. The owner
of a request (for token and lease ownership) is its ring index.

Doorbells (docs/pool-format.md): where the pool has them and the native helper reads them, the
listener does not read those 2R words on every look: it reads the doorbell lines (a byte per ring,
64 to a line, bumped by a client after each request it publishes) and looks only at the rings
whose byte moved, plus a sweep of SWEEP_S per whole set of rings for a request that came without
a doorbell (an old client, a lost bump). The native fast path reads them too once `fast_serve`
takes the doorbell state (`FAST_SERVE_BELLS` in the native module); until then the fast path keeps
its pass over every ring, and `doorbells_with_python` chooses from which ring count the doorbells
with Python's answers beat that pass.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from belugactl.dataplane import native
from belugactl.dataplane.mds.listener import Listener, register_listener
from belugactl.dataplane.mds.service import BATCH_OPS
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    REQ_READY,
    Code,
    Op,
    encode_get_reply,
    encode_get_reply_one,
)

if TYPE_CHECKING:
    from belugactl.dataplane.mds.server import MetadataServer


# How often the slot-by-slot safety net (resync) runs at most, in seconds.
RESYNC_S = 1.0
# The doorbells' sweep: every ring looked at once per SWEEP_S whatever its doorbell says, a slice at
# a time (a ring every SWEEP_S / rings), so no look grows with the ring count.
SWEEP_S = 0.1


def mirror_reply(e: Any) -> bytes:
    """The GET reply the native mirror answers an index entry with (lease 0: the fast path writes its
    own). Most entries are one block with a checksum: one pack, no extents list (a restart makes
    millions)."""
    a = e.alloc
    one, crc = a.single, e.checksum
    if one is not None and crc is not None:
        size, off = one
        n = a.nbytes
        return encode_get_reply_one(n, off, size if size < n else n, crc)
    return encode_get_reply(0, a.nbytes, a.extents, crc)


def mirror_entries(fi: Any, entries: Sequence[Any], reply: Callable[[Any], bytes]) -> int:
    """The mirror's puts of many entries in one native call (a restart's millions). The native side
    packs a one-block checksummed entry's reply as `mirror_reply` does (tests/dataplane/
    test_fast_index_table.py compares the bytes) and asks `reply` for every other entry's."""
    return native.fi_put_entries(fi, entries, reply, True)  # type: ignore[misc]


@register_listener
class RingListener(Listener):
    scheme = "cxl"
    spins = True

    def __init__(self, server: MetadataServer) -> None:
        super().__init__(server)
        g = server.geometry
        self.geometry = g
        self.buf = server.pool.buf
        self.flush = server.flush
        self.max_payload = g.slot_size - HEADER_SIZE
        R = g.ring_count
        self._cursor = array("q", [0] * R)
        # The native wait watches 2R words: each ring's cursor slot, then each ring's slot 0.
        self._offs = array("q", [g.slot_offset(r, 0) for r in range(R)] * 2)
        self._start = 0
        # The doorbells' state (bells_new in _native_ring.c), None where the pool or the helper has none.
        self._bells: Any = None
        if native.optional("bells_new") is not None and g.has_doorbells:
            self._bells = native._native.bells_new(R, g.doorbell_offset(0), max(1, int(SWEEP_S * 1e9 / R)))
        self._fast_bells = self._bells is not None and bool(getattr(native._native, "FAST_SERVE_BELLS", 0))
        fast = server.config.fast_path and native.fast_serve is not None
        if fast and self._fast_bells and g.ring_count < self.fast_bells_from_rings:
            self._bells, self._fast_bells = None, False  # the fast path's pass over every ring costs less here
        if fast and self._bells is not None and not self._fast_bells:
            if g.ring_count >= self.doorbells_with_python:
                fast = False  # the doorbells, and Python's answers
            else:
                self._bells = None  # the fast path's pass over every ring is cheaper at this count
        self._fast = None
        if fast:
            self._fast = native.fi_new()
            server.index.attach_mirror(
                self._fast,
                native.fi_put,
                native.fi_del,
                mirror_reply,
                put_entries=mirror_entries if native.fi_put_entries is not None else None,
            )
        self.fast_requests = 0
        self._every_slot: array | None = None  # every slot's offset, for resync (built when first needed)
        self._next_resync = 0.0
        self.rings_resynced = 0
        self.bad_slots = 0
        self.stale_fenced = 0

    # Without a doorbell-reading fast path: from this many rings up, the doorbells and Python's
    # answers instead of the fast path's pass over every ring (docs/measurements.md, 2026-12-05).
    doorbells_with_python = 1 << 62
    # With the doorbell-reading fast path: from this many rings up it reads the doorbells; below, its
    # pass over every ring is cheaper than the doorbells' bookkeeping (a pass is 0.2 us at 16 rings:
    # bench rpc at 16 rings gave 2.7-3.3 Mops with the doorbells against 4.2-4.5 without,
    # docs/measurements.md 2026-12-05; at 1,152 rings a pass is 14-19 us, the doorbells 1.7 us).
    fast_bells_from_rings = 128

    @classmethod
    def from_config(cls, server: MetadataServer) -> list[Listener]:
        return [cls(server)] if server.geometry.ring_count > 0 else []

    # --- start-up -----------------------------------------------------------------------------
    def after_epoch(self) -> None:
        """Answer requests left in the rings by the previous incarnation with STALE_EPOCH."""
        g = self.geometry
        epoch32 = self.server.service.epoch32
        for r in range(g.ring_count):
            ready = []
            for s in range(g.slots_per_ring):
                off = g.slot_offset(r, s)
                if native.load64(self.buf, off) == REQ_READY:
                    _st, seq, _magic, _epoch, op, _c, _n = HEADER.unpack_from(self.buf, off)
                    ready.append((seq, off, op))
            for seq, off, op in sorted(ready):
                slots.reply(self.buf, off, seq, epoch32, op, int(Code.STALE_EPOCH), b"", self.flush)
                self.stale_fenced += 1
            self._set_cursor(r, 0)
        if self._bells is not None:
            native._native.bells_pend_all(self._bells)

    def _set_cursor(self, ring: int, slot: int) -> None:
        self._cursor[ring] = slot
        self._offs[ring] = self.geometry.slot_offset(ring, slot)

    # --- serving ------------------------------------------------------------------------------
    def serve(self, spin_ns: int) -> int:
        served = 0
        if self._fast is not None and self.server.service.ready:
            served, stop = self.fast_burst(self._start, spin_ns)
            # stop >= 0: a ready slot the fast path leaves to Python
            t = slots.take(self.buf, self._offs, stop, self.max_payload, 0, self.flush) if stop >= 0 else None
        elif self._bells is not None:
            t = native._native.bells_take(self.buf, self._offs, self._bells, self.max_payload, spin_ns, self.flush)
        else:
            t = slots.take(self.buf, self._offs, self._start, self.max_payload, spin_ns, self.flush)
        if t is not None:
            self._start = self.serve_taken(t)
            served += 1
        return served

    def idle_wait(self, every_s: float, timeout_s: float, fd: int = -1) -> tuple[int, int]:
        """Wait, without a core, for a request in a ring, `fd` readable, or `timeout_s`: every ring's
        cursor slot and slot 0 looked at every `every_s`, in C without the GIL, instead of a turn of
        the server's Python loop for each look. Returns (what ended it, requests answered): -1 the
        timeout, -2 `fd`, >= 0 a ready slot left to Python.

        With the fast path, requests it handles (lookups, GET_MANY, pings) are answered in the same
        call the moment the wait sees them (`fast_serve` with a sleep): an idle server's first request
        does not wait for a cold turn of the Python loop first; the bookkeeping follows, after the
        reply went out."""
        sleep_ns = max(1, int(every_s * 1e9))
        timeout_ns = int(timeout_s * 1e9)
        if self._fast is not None and self.server.service.ready:
            served, stop = self.fast_burst(self._start, timeout_ns, sleep_ns, fd)
            return stop, served
        if self._bells is not None:
            got = native._native.bells_wait(self.buf, self._offs, self._bells, timeout_ns, sleep_ns, self.flush, fd)
            return int(got), 0
        return int(native.idle_wait_any(self.buf, self._offs, REQ_READY, timeout_ns, sleep_ns, self.flush, fd)), 0

    def rotate(self) -> None:
        """Fairness between rings: look at the next ring first next time."""
        self._start = self._start + 1 if self._start + 1 < self.geometry.ring_count else 0

    def fast_burst(self, start: int, spin_ns: int, sleep_ns: int = 0, fd: int = -1) -> tuple[int, int]:
        """Let the native helper answer lookups, GETs, GET_MANYs and pings until something else shows
        up; (served, stop). `sleep_ns`: sleep that long between looks (and wake on `fd`, stop -2)
        instead of spinning, returning once a run of requests is answered."""
        server = self.server
        index = server.index
        service = server.service
        hist = service.latency_by_op[Op.LOOKUP_PREFIX]
        assert hist is not None
        first_lease = index.next_lease
        extra = (self._bells,) if self._fast_bells else ()
        out = native.fast_serve(
            self._fast, self.buf, self._offs, self._cursor, self.geometry.slots_per_ring,
            self.geometry.slot_size, service.epoch32, index.ns_id_bound, self.flush, spin_ns,
            start, index.next_lease, 256, hist.bounds_ns, hist.counts, service.leases.key_bytes, sleep_ns, fd,
            *extra,
        )  # fmt: skip
        served, stop, lease_next, log, lookups, hits, sum_ns, per_entry, gets, manys, many_keys, many_hits = out
        if served:
            index.next_lease = lease_next
            granted = lease_next - first_lease
            if granted:  # before anything else can evict or delete
                index.apply_lease_burst(first_lease, lease_next - 1, granted, log, per_entry)
            index.counters.hits += hits + gets + many_hits
            index.counters.misses += lookups - hits + many_keys - many_hits
            service.requests += served
            service._op_counts[Op.LOOKUP_PREFIX] += lookups
            service._op_counts[Op.GET] += gets
            service._op_counts[Op.GET_MANY] += manys
            service._op_counts[Op.PING] += served - lookups - gets - manys
            hist.total += sum_ns / 1e9
            hist.n += lookups
            self.requests += served
            self.fast_requests += served
        return served, stop

    def poll_once(self, timeout_ns: int = 0) -> bool:
        """Serve at most one ring request (tests drive the server with this, without a loop)."""
        if self._bells is not None:
            t = native._native.bells_take(self.buf, self._offs, self._bells, self.max_payload, timeout_ns, self.flush)
        else:
            t = slots.take(self.buf, self._offs, 0, self.max_payload, timeout_ns, self.flush)
        if t is None:
            return False
        self.serve_taken(t)
        return True

    def serve_taken(self, t: slots.Taken) -> int:
        """Validate and answer one taken slot; return the ring to look at first next time."""
        i, seq, magic, epoch, op, _length, payload = t
        g = self.geometry
        R = g.ring_count
        ring = i if i < R else i - R
        buf = self.buf
        offs = self._offs
        if i >= R and self._cursor[ring] != 0:
            if native.load64(buf, offs[ring]) == REQ_READY:
                return ring  # the cursor slot is ready too: serve in order, slot 0 comes later
            self._set_cursor(ring, 0)  # a client (re)started its ring
        slot = self._cursor[ring]
        off = offs[ring]
        service = self.server.service
        t0 = time.perf_counter()
        if magic != MAGIC:
            code, rep = service.error(Code.BAD_MAGIC)
            self.bad_slots += 1
        elif seq % g.slots_per_ring != slot:
            code, rep = service.error(Code.BAD_SEQ)
            self.bad_slots += 1
        elif payload is None:
            code, rep = service.error(Code.BAD_LENGTH)
            self.bad_slots += 1
        else:
            index = self.server.index
            index.begin_request(ring)
            try:
                code, rep = service.handle(op, epoch, payload, self.max_payload, ring)
            finally:
                index.end_request()
        slots.reply(buf, off, seq, service.epoch32, op & 0xFFFF, code, rep, self.flush)
        lat = service.latency_by_op
        if op < len(lat):
            h = lat[op]
            if h is not None:
                h.observe(time.perf_counter() - t0)
        self.requests += 1
        self._set_cursor(ring, slot + 1 if slot + 1 < g.slots_per_ring else 0)
        if op in BATCH_OPS:  # one step of a batch: the other rings go before this one's next step
            return ring + 1 if ring + 1 < R else 0
        return ring

    def housekeeping(self, now: float) -> None:
        # The safety net reads every slot of every ring: with a ring per vLLM process that is
        # hundreds of rings x hundreds of slots, so it runs at most once per RESYNC_S, not on every
        # housekeeping tick (a client out of step waits that long once; well-behaved ones never do).
        if now >= self._next_resync:
            self._next_resync = now + RESYNC_S
            self.resync()

    def _all_slots(self) -> array:
        if self._every_slot is None:
            g = self.geometry
            self._every_slot = array(
                "q", [g.slot_offset(r, s) for r in range(g.ring_count) for s in range(g.slots_per_ring)]
            )
        return self._every_slot

    def resync(self) -> int:
        """Safety net: a ring whose cursor slot is idle while other slots wait gets its cursor moved
        to the oldest waiting request (a client that pipelined after a reset without HELLO, or one
        that scribbled). Clients send in order, so this never reorders a well-behaved ring.

        One native scan over every slot finds the rings with a request waiting (none, when idle);
        only those are looked at slot by slot."""
        g = self.geometry
        buf = self.buf
        S = g.slots_per_ring
        every = self._all_slots()
        moved = 0
        start = 0
        for _ in range(g.ring_count):  # each pass moves past one ring: bounded
            t = slots.take(buf, every, start, 0, 0, self.flush)
            if t is None or (start and t[0] < start):  # nothing waiting (from `start` on, no wrap)
                break
            r = t[0] // S
            start = (r + 1) * S
            if native.load64(buf, self._offs[r]) != REQ_READY:
                waiting = []
                for slot in range(S):
                    off = g.slot_offset(r, slot)
                    if native.load64(buf, off) == REQ_READY:
                        waiting.append((HEADER.unpack_from(buf, off)[1], slot))
                if waiting:
                    self._set_cursor(r, min(waiting)[1])
                    if self._bells is not None:
                        native._native.bells_pend_all(self._bells, r)
                    moved += 1
            if start >= len(every):
                break
        self.rings_resynced += moved
        return moved

    def stats(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "rings": g.ring_count,
            "slots_per_ring": g.slots_per_ring,
            "slot_size": g.slot_size,
            "native_fast_path": self._fast is not None,
            "requests": self.requests,
            "fast_requests": self.fast_requests,
            "bad_slots": self.bad_slots,
            "rings_resynced": self.rings_resynced,
            "stale_fenced_at_start": self.stale_fenced,
            "doorbells": native._native.bells_stats(self._bells) if self._bells is not None else None,
            "doorbells_in_fast_path": self._fast_bells,
        }
