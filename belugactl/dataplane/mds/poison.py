"""Poisoned lines: the metadata server stops handing them out and stops serving blocks on them.

A memory device reports lines it can no longer read correctly (a media error, poison: `cxl list -R
-L`, doctor's `cxl.media-errors`). A reader that loads a poisoned line takes a machine check, so a
block on one must leave the index, and the space must never be allocated again.

Where the server hears of them (pool-relative byte ranges, as doctor's
`details.poisoned_pool_ranges` gives them):
- `POST /poison` on the admin port (admin.py): doctor's report piped to it (`belugactl doctor --json |
  curl --data-binary @- http://127.0.0.1:9470/poison`), an operator, or a test on a file pool.
  Loopback clients only (or signed with the rack secret where the admin port checks signed writes);
  the body is bounded (`MAX_BODY`, `MAX_RANGES_PER_POST`) and checked before anything is queued
  (`parse_ranges`).
- a periodic check (`PoisonChecker`, a background thread, never in the loop) calling a reader
  (`reader()` returns ranges, or None when the lists could not be read) every
  `serve.metadata.poison_check_s` seconds (0: off). The server has one only where its pool is a device
  (`pool/poison_reading.py`, the reader doctor uses); a file pool has no poison list.

Both only queue ranges (`PoisonWatch.submit`, thread-safe). The server loop applies them
(`PoisonWatch.step`, between turns and at housekeeping), with bounded work each turn:
1. every chunk a new range touches is quarantined in the allocator (rounded out to its 2 MiB unit:
   never handed out again, its blocks not given back when freed);
2. only if a quarantined chunk was in use: one copy of the index's entries (a C-speed list copy)
   and of the reservations, then `SCAN_STEP` of them checked per call; a committed block whose
   extents overlap a poisoned range is removed like a DELETE (`KVIndex.drop_overlapping`: the
   removals log names it with why "deleted", which the connector publishes as a KV event), and a
   reservation that overlaps is watched and dropped when it commits (aborting it early would free its
   other blocks while the writer may still write them);
3. ranges outside the shared KV area cannot be quarantined: on the header, the rings or the journal
   the server says so loudly (stderr once per range, /stats `poison.outside_kv`, /readyz's reason);
   on a host partition or unused space it notes them.

A reader holding a lease on a dropped block: the lease is not revoked. The block leaves every
lookup at once (the next GET or lookup is a miss) and its space is freed when the lease ends, as for
any DELETE, so a copy under the lease never races a new writer of the space. A copy that reads the
bad line meanwhile is the hardware's business: a machine check on real memory (the kernel's memory
failure handling signals the process), and on the CPU pool hit's one-call load the CRC32C check
against the writer's checksum turns corrupt bytes into a miss (plugins/vllm_beluga).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from belugactl.pool.geometry import HEADER_REGION

SCAN_STEP = 1024  # entries or reservations checked per call of step (one loop turn)
APPLY_STEP = 256  # queued ranges merged and quarantined per call of step
MAX_RANGES = 65536  # distinct poisoned ranges the server keeps (more: merged into the last)
MAX_BODY = 256 << 10  # POST /poison body
MAX_RANGES_PER_POST = 4096
DOCTOR_CHECK = "cxl.media-errors"  # the doctor check whose details name the poisoned pool ranges
MIN_CHECK_S = 1.0  # the periodic check's shortest interval (0 turns it off)


class PoisonRequestError(ValueError):
    """A POST /poison body that is refused (nothing of it was queued)."""


def parse_ranges(body: bytes, pool_size: int) -> list[tuple[int, int]]:
    """Ranges (offset, length) from a JSON body: `{"ranges": [{"offset": N, "length": N}, ...]}`, a
    whole `belugactl doctor --json` report (its `cxl.media-errors` check's `poisoned_pool_ranges`: a
    report without that check, or a passing one, gives none), that check's `details`, or a bare list.

    Untrusted input: every offset and length is a plain non-negative integer (no bool, float or
    string), lengths positive, and each range inside the pool."""
    if len(body) > MAX_BODY:
        raise PoisonRequestError(f"the body is {len(body)} bytes, over {MAX_BODY}")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PoisonRequestError(f"the body is not JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("checks"), list):  # a doctor --json report
        check = next((c for c in data["checks"] if isinstance(c, dict) and c.get("id") == DOCTOR_CHECK), None)
        details = check.get("details") if isinstance(check, dict) else None
        data = details if isinstance(details, dict) else {"ranges": []}
        data.setdefault("poisoned_pool_ranges", [])
    items = data.get("ranges", data.get("poisoned_pool_ranges")) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise PoisonRequestError('expected {"ranges": [{"offset": N, "length": N}, ...]}')
    if len(items) > MAX_RANGES_PER_POST:
        raise PoisonRequestError(f"{len(items)} ranges in one request, over {MAX_RANGES_PER_POST}")
    out: list[tuple[int, int]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PoisonRequestError(f"range {i} is not an object with offset and length")
        off, length = item.get("offset"), item.get("length")
        for name, v in (("offset", off), ("length", length)):
            if type(v) is not int:
                raise PoisonRequestError(f"range {i}: {name} is not an integer")
        assert isinstance(off, int) and isinstance(length, int)
        if off < 0 or length <= 0:
            raise PoisonRequestError(f"range {i}: offset {off}, length {length}: need offset >= 0, length > 0")
        if off + length > pool_size:
            raise PoisonRequestError(f"range {i}: {off:#x}+{length} ends past the pool's {pool_size} bytes")
        out.append((off, length))
    return out


class RangeSet:
    """Disjoint, sorted [start, end) ranges; `add` merges and says what was new."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self):  # -> Iterator[tuple[int, int]]
        return zip(self.starts, self.ends, strict=True)

    @property
    def bytes(self) -> int:
        return sum(e - s for s, e in self)

    def add(self, start: int, end: int) -> list[tuple[int, int]]:
        """Cover [start, end); the pieces of it not covered before."""
        if start >= end:
            return []
        new: list[tuple[int, int]] = []
        pos = start
        i = bisect_right(self.ends, start)  # the first range ending after start
        j = i
        lo, hi = start, end
        while j < len(self.starts) and self.starts[j] <= end:
            s, e = self.starts[j], self.ends[j]
            if s > pos:
                new.append((pos, s))
            pos = max(pos, e)
            lo, hi = min(lo, s), max(hi, e)
            j += 1
        if pos < end:
            new.append((pos, end))
        self.starts[i:j] = [lo]
        self.ends[i:j] = [hi]
        return new

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect_right(self.ends, start)
        return i < len(self.starts) and self.starts[i] < end

    def hits(self, extents: Iterable[tuple[int, int]]) -> bool:
        return any(self.overlaps(off, off + n) for off, n in extents)


def _areas(geometry: Any) -> list[tuple[str, int, int, bool]]:
    """(name, start, end, the server's own) of the pool's areas."""
    g = geometry
    return [
        ("header", 0, HEADER_REGION, True),
        ("rings", g.rpc_offset, g.rpc_offset + g.ring_count * g.ring_stride, True),
        ("journal", g.journal_offset, g.journal_offset + g.journal_size, True),
        ("shared KV area", g.shared_kv_offset, g.shared_kv_offset + g.shared_kv_size, False),
    ]


class PoisonWatch:
    """The server's poisoned ranges: queued from any thread, applied by the loop in bounded steps."""

    def __init__(self, index: Any, geometry: Any, *, log: Callable[[str], None] | None = None) -> None:
        self.index = index
        self.geometry = geometry
        self.pool_size = geometry.pool_size
        self.kv_start = geometry.shared_kv_offset
        self.kv_end = geometry.shared_kv_offset + geometry.shared_kv_size
        self._log = log or (lambda msg: print(f"metadata server: {msg}", file=sys.stderr, flush=True))
        self._inbox: deque[tuple[str, list[tuple[int, int]]]] = deque()
        self._inbox_lock = threading.Lock()
        self._queued = 0  # ranges in the inbox (bounded: a flood is refused, not queued)
        self._todo: deque[tuple[str, int, int]] = deque()  # taken from the inbox, applied APPLY_STEP a turn
        self._rescan = False  # a quarantined chunk was in use: scan once the queued ranges are applied
        self._check_sent: set[tuple[int, int]] = set()  # what the periodic check queued already
        self.known = RangeSet()  # every poisoned range heard of, in the pool
        self.kv = RangeSet()  # the part of them in the shared KV area (what blocks are checked against)
        self.outside: list[dict[str, object]] = []  # pieces outside the KV area, with their area
        self.loud: list[str] = []  # pieces on the server's own areas (header, rings, journal)
        self._candidates: list[Any] = []  # the scan: entries and reservations to check
        self._cursor = 0
        self._watch: list[tuple[Any, Any]] = []  # (key, allocation) of reservations on poisoned lines
        self.counters = {
            "pushes": 0,
            "ranges_received": 0,
            "blocks_dropped": 0,
            "reservations_watched": 0,
            "scans": 0,
            "entries_checked": 0,
            "checks": 0,
            "checks_unread": 0,
        }
        self.last_check: dict[str, object] | None = None

    # --- any thread --------------------------------------------------------------------------
    def submit(self, ranges: list[tuple[int, int]], source: str, *, push: bool = True) -> int:
        """Queue ranges for the loop; how many were queued (0 when the inbox is full). `push`: from
        POST /poison (counted as a push), else from the periodic check."""
        with self._inbox_lock:
            if self._queued + len(self._todo) + len(ranges) > 4 * MAX_RANGES_PER_POST:
                return 0
            self._inbox.append((source, list(ranges)))
            self._queued += len(ranges)
            self.counters["pushes"] += int(push)
            self.counters["ranges_received"] += len(ranges)
        return len(ranges)

    def record_check(self, ranges: list[tuple[int, int]] | None, problem: str | None = None) -> None:
        """The periodic check's result (its thread): queue what it found."""
        self.counters["checks"] += 1
        if ranges is None:
            self.counters["checks_unread"] += 1
        else:
            # The device lists the same lines every time: queue only what this check has not yet.
            new = [r for r in ranges if r not in self._check_sent]
            if new and self.submit(new, "the device's poison list", push=False):
                self._check_sent.update(new)
        self.last_check = {"time": time.time(), "read": ranges is not None, "ranges": len(ranges or ()),
                           "problem": problem}  # fmt: skip

    # --- the loop ----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Work is waiting for the loop: queued ranges, a scan or a watched reservation."""
        return bool(self._inbox or self._todo) or self._cursor < len(self._candidates) or bool(self._watch)

    def step(self, budget: int = SCAN_STEP) -> int:
        """Apply queued ranges, then check at most `budget` entries; how many were checked."""
        if self._inbox or self._todo:
            self._apply_inbox()
        checked = 0
        if self._cursor < len(self._candidates):
            checked = self._scan(budget)
        if self._watch:
            self._check_watch()
        return checked

    def _apply_inbox(self, limit: int = APPLY_STEP) -> None:
        if self._inbox:
            with self._inbox_lock:
                for source, ranges in self._inbox:
                    self._todo.extend((source, off, n) for off, n in ranges)
                self._inbox.clear()
                self._queued = 0
        todo = self._todo
        for _ in range(min(limit, len(todo))):
            source, off, length = todo.popleft()
            if len(self.known) >= MAX_RANGES:
                off, length = self._widen_last(off, length)
            for start, end in self.known.add(off, off + length):
                self._rescan |= self._place(start, end, source)
        if self._rescan and not todo:
            self._rescan = False
            # One copy of what may lie on the chunks that were in use; checked SCAN_STEP a turn.
            self._candidates = list(self.index.entries.values())
            self._candidates += list(self.index.pending.values())
            self._cursor = 0
            self.counters["scans"] += 1

    def _widen_last(self, off: int, length: int) -> tuple[int, int]:
        """At the cap, a new range is merged with its nearest neighbour (over-quarantining, never
        forgetting a poisoned line)."""
        i = max(0, min(bisect_right(self.known.starts, off), len(self.known) - 1))
        lo = min(off, self.known.starts[i])
        hi = max(off + length, self.known.ends[i])
        return lo, hi - lo

    def _place(self, start: int, end: int, source: str) -> bool:
        """A new poisoned piece: quarantine its KV part, report the rest. True when a quarantined
        chunk was in use (blocks may lie on it)."""
        in_use = False
        lo, hi = max(start, self.kv_start), min(end, self.kv_end)
        if lo < hi:
            self.kv.add(lo, hi)
            _new, used = self.index.alloc.quarantine(lo, hi - lo)
            in_use = bool(used)
        for name, a_lo, a_hi, own in _areas(self.geometry):
            if own and max(start, a_lo) < min(end, a_hi):
                piece = f"{max(start, a_lo):#x}+{min(end, a_hi) - max(start, a_lo)}"
                self.outside.append({"offset": max(start, a_lo), "length": min(end, a_hi) - max(start, a_lo),
                                     "area": name})  # fmt: skip
                msg = (
                    f"POISONED LINES IN THE {name.upper()} at {piece} (from {source}): the server cannot "
                    f"quarantine its own {name}; stop serving, have the poison cleared or the device replaced, "
                    "and lay the pool out again (setup) before trusting it"
                )
                self.loud.append(msg)
                self._log(msg)
        covered = sum(max(0, min(end, a_hi) - max(start, a_lo)) for _n, a_lo, a_hi, _o in _areas(self.geometry))
        if covered < end - start:
            self.outside.append({"offset": start, "length": end - start, "area": "outside the server's areas"})
            self._log(f"poisoned lines at {start:#x}+{end - start} (from {source}) lie partly outside the server's "
                      "areas (a host partition or unused space): not the metadata server's to quarantine")  # fmt: skip
        del self.outside[:-256]  # bounded: the newest kept
        del self.loud[:-16]
        return in_use

    def _scan(self, budget: int) -> int:
        cands = self._candidates[self._cursor : self._cursor + budget]
        self._cursor += len(cands)
        hits = self._hits
        entries: list[Any] = []
        for c in cands:
            if hasattr(c, "deadline"):  # a reservation: watched until it commits or ends
                if hits(c.alloc):
                    self._watch.append((c.key, c.alloc))
                    self.counters["reservations_watched"] += 1
            else:
                entries.append(c)
        self.counters["blocks_dropped"] += self.index.drop_overlapping(entries, hits)
        self.counters["entries_checked"] += len(cands)
        if self._cursor >= len(self._candidates):
            self._candidates, self._cursor = [], 0
        return len(cands)

    def _hits(self, alloc: Any) -> bool:
        return self.kv.hits(alloc.extents)

    def _check_watch(self) -> None:
        index = self.index
        keep: list[tuple[Any, Any]] = []
        for key, alloc in self._watch:
            token = index.pending_keys.get(key)
            if token is not None and index.pending[token].alloc is alloc:
                keep.append((key, alloc))  # still being written
                continue
            e = index.entries.get(key)
            if e is not None and e.alloc is alloc:
                self.counters["blocks_dropped"] += index.drop_overlapping([e], self._hits)
        self._watch = keep

    # --- what the admin thread and the snapshot read -----------------------------------------
    @property
    def note(self) -> str:
        """A loud line for /readyz when the server's own areas are poisoned; empty otherwise."""
        if not self.loud:
            return ""
        return f"{len(self.loud)} poisoned range(s) in the server's own areas (see /stats poison.outside_kv)"

    def stats(self) -> dict[str, object]:
        alloc = self.index.alloc
        return {
            "ranges_known": len(self.known),
            "bytes_known": self.known.bytes,
            "ranges_in_kv": len(self.kv),
            "chunks_quarantined": len(alloc.quarantined),
            "bytes_quarantined": alloc.quarantined_bytes,
            "scan_left": len(self._candidates) - self._cursor,
            "reservations_waiting": len(self._watch),
            "outside_kv": list(self.outside[-16:]),
            "alerts": list(self.loud),
            "last_check": self.last_check,
            **self.counters,
        }


class PoisonChecker:
    """The periodic check: a daemon thread calling `reader` every `interval_s` and queueing what it
    finds. The reader runs outside the loop (it may run `cxl list`, which takes a while)."""

    def __init__(self, watch: PoisonWatch, reader: Callable[[], tuple[list[tuple[int, int]] | None, str | None]],
                 interval_s: float) -> None:  # fmt: skip
        self.watch, self.reader = watch, reader
        self.interval_s = max(MIN_CHECK_S, interval_s)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mds-poison-check", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ranges, problem = self.reader()
            except Exception as exc:  # a reader's bug must not end the checks: say so in /stats
                ranges, problem = None, f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            self.watch.record_check(ranges, problem)
            self._stop.wait(self.interval_s)
