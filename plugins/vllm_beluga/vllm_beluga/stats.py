"""Counters of what the connector did, readable by operators and tests without scraping logs.

Each connector instance (scheduler, each worker) owns one JSON file (`stats_path` with the role
appended) and rewrites it atomically after counters changed, from a writer thread of its own (never
on the thread that counted): once they have been still for `quiet_s` (the request that changed them
is past its critical path), or `max_delay_s` after the first unwritten change under steady traffic,
and at most every `min_interval_s`.

That thread looks every `min_interval_s` instead of being woken by the counting thread. A pool hit
changes counters right at its start (the scheduler's lookup, a worker's load), and a wake-up then
(a futex wake on a sleeping thread) followed by a JSON dump that holds the GIL landed in the hit
and made its lookup measurably slower than without a stats file.

The same counters also feed vLLM's own metrics (vllm_metrics.py): `take_interval` hands over what
was added since its last call, and each addition to a timing counter (`*_us`) is one observation
of a latency histogram (kept up to MAX_OBSERVATIONS per interval; the sums stay exact).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

# Observations of one timing counter kept between two `take_interval` calls (vLLM asks every step).
MAX_OBSERVATIONS = 1024


class ConnectorStats:
    def __init__(
        self,
        path: str | None,
        *,
        role: str,
        min_interval_s: float = 0.2,
        quiet_s: float = 0.05,
        max_delay_s: float = 1.0,
    ) -> None:
        self.role = role
        self.path = Path(f"{path}.{role}.json") if path else None
        self.counters: dict[str, int] = {}
        self.state: dict[str, object] = {"role": role, "pid": os.getpid(), "healthy": True}
        self._lock = threading.Lock()
        # Held for a whole write: the writer thread and a thread that sets state may flush at
        # once, and two writes of the one temporary file interleave (CI read a document with the
        # tail of a longer one after it). It also keeps an older snapshot from replacing a newer.
        self._write_lock = threading.Lock()
        self._min_interval = min_interval_s
        self._quiet = quiet_s
        self._max_delay = max_delay_s
        self._last_write = 0.0
        self._dirty = False
        self._changed_at = 0.0  # the last change (time.monotonic)
        self._dirty_since = 0.0  # the first change the file does not hold yet
        # Counters change on a request's critical path (the scheduler's lookup, a worker's load):
        # the file is written by one writer thread, never by the caller. A synchronous rewrite
        # there (json, write, rename) cost a pool hit's lookup about a millisecond in the engine.
        self._writer: threading.Thread | None = None
        self._interval: dict[str, int] = {}
        self._observed: dict[str, list[int]] = {}

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + value
            self._interval[name] = self._interval.get(name, 0) + value
            if name.endswith("_us"):
                seen = self._observed.setdefault(name, [])
                if len(seen) < MAX_OBSERVATIONS:
                    seen.append(value)
            now = time.monotonic()
            if not self._dirty:
                self._dirty_since = now
                self._dirty = True
            self._changed_at = now
        if self.path is not None and self._writer is None:
            self._start_writer()

    def take_interval(self) -> tuple[dict[str, int], dict[str, list[int]]]:
        """What was added since the last call: counter increments, and each timing counter's
        individual additions (microseconds); both empty when nothing happened."""
        with self._lock:
            interval, observed = self._interval, self._observed
            self._interval, self._observed = {}, {}
        return interval, observed

    def set(self, name: str, value: object) -> None:
        """State (health, addresses, the last error): rare, and written at once, so an operator
        reading the file sees a ring error as soon as it happened."""
        with self._lock:
            if self.state.get(name) == value:
                return
            self.state[name] = value
            self._dirty = True
        self.flush()

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return self._document()

    def _document(self) -> dict[str, object]:
        """What the file holds (called with the lock held)."""
        return {**self.state, "counters": dict(self.counters), "time": time.time()}

    def flush(self) -> None:
        """Write the file now if anything changed since the last write (the caller's thread)."""
        if self.path is None or not self._dirty:
            return
        with self._write_lock:
            with self._lock:  # a change after this snapshot leaves the stats dirty for the next write
                if not self._dirty:
                    return  # another thread wrote it while this one waited
                doc = self._document()
                self._dirty = False
            self._last_write = time.monotonic()
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError:
                # Stats are for operators; a full disk must not fail inference.
                pass

    def _start_writer(self) -> None:
        with self._lock:
            if self._writer is None:
                name = f"beluga-stats-{self.role}"
                self._writer = threading.Thread(target=self._write_loop, name=name, daemon=True)
                self._writer.start()

    def due(self, now: float) -> bool:
        """Whether the writer writes at `now`: changes the file lacks, no write in the last
        `min_interval_s`, and the counters still for `quiet_s` or changing for `max_delay_s`."""
        if not self._dirty or now - self._last_write < self._min_interval:
            return False
        return now - self._changed_at >= self._quiet or now - self._dirty_since >= self._max_delay

    def _write_loop(self) -> None:
        """Look every `min_interval_s` (5 ms at the least) and write when `due`."""
        period = max(self._min_interval, 0.005)
        while True:
            time.sleep(period)
            if self.due(time.monotonic()):
                self.flush()


def read_stats(paths: Iterable[Path]) -> dict[str, dict[str, object]]:
    """Load every stats file given (missing or torn ones are skipped)."""
    out: dict[str, dict[str, object]] = {}
    for path in paths:
        try:
            out[path.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out
