"""Fill the worker's page tables for a file pool ahead of its first pool hit.

A file pool (the CPU demo, CI, single-host development) is mapped in 4 KiB pages. The blocks a
worker loads were mostly written by another process (another instance's save), through that
process's own mapping, so this process has no page-table entries for them: the copy faults once
every 16 pages (the kernel's fault-around) of every block it reads, a large share of the load's
time. `PoolPrefault` maps the pool's pages once, on a thread of its own, right after the KV caches
are registered, so the hits that follow find them mapped.

Not on a devdax pool: it is mapped in 2 MiB or 1 GiB pages, a handful of faults per hit. Not past
`max_bytes`: populating a file pool allocates its page cache, all of it (a hole reads as a page of
zeros), which a large development pool should not take at start-up.
"""

from __future__ import annotations

import threading
import time
from typing import Any

DEFAULT_MAX_BYTES = 16 << 30


class PoolPrefault:
    def __init__(self, pool: Any, stats: Any, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.pool = pool
        self.stats = stats
        self.max_bytes = max_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def decision(self) -> str | None:
        """Why the pool is not prefaulted, or None when it is to be."""
        if self.pool.is_devdax:
            return "not needed: a devdax pool is mapped in huge pages"
        if self.max_bytes <= 0:
            return "off (prefault_max_bytes 0)"
        if self.pool.size > self.max_bytes:
            return f"skipped: the pool file holds {self.pool.size} bytes, over prefault_max_bytes {self.max_bytes}"
        return None

    def start(self) -> bool:
        """Start the prefault thread; False (and the reason in the stats) when there is none to run."""
        why = self.decision()
        if why is not None:
            self.stats.set("pool_prefault", why)
            return False
        self.stats.set("pool_prefault", "running")
        self._thread = threading.Thread(target=self.run, name="beluga-prefault", daemon=True)
        self._thread.start()
        return True

    def run(self) -> None:
        started = time.perf_counter()
        try:
            done = self.pool.prefault(stop=self._stop)
        except (OSError, ValueError) as exc:  # no MADV_POPULATE_READ (Linux < 5.14), or closed under us
            self.stats.set("pool_prefault", f"failed: {exc}; pool hits fault their pages in as they copy")
            return
        ms = (time.perf_counter() - started) * 1e3
        state = "stopped" if self._stop.is_set() else "done"
        self.stats.set("pool_prefault", f"{state}: {done >> 20} MiB in {ms:.0f} ms")

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread (between two chunks) before the mapping goes away."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
