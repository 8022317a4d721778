"""Fencing: no extent reserved in epoch N is handed out again while an epoch-N writer may still write it.

The argument (docs/dataplane.md, "Fencing") in short:
- A writer may write into a reservation only until its own deadline: the moment it sent RESERVE
  plus 90 % of the writer window the server announced in HELLO (`writer_window_ms`, the
  reservation TTL), and only while the pool header's epoch is the one it reserved under
  (`KVIndexClient.writable`). Past either, it abandons the reservation without writing.
- Within one epoch the server reclaims a reservation only after the full TTL from when it granted
  it, which is after the writer's deadline: a reclaimed extent has no writer left.
- Across a restart the new server cannot know which extents the dead one had reserved. Every
  reservation the old server granted was granted before it died, so its writer's deadline is at
  most (death + window) <= (this start + window). Each server records, in one cache line of the
  journal area's header, the wall-clock time until which its reservations may be written (raised
  at most once a second, with a second of slack) and its window; cleared on a clean shutdown
  with no reservation open. A new server quarantines: RESERVE answers NOT_READY until
  min(recorded window, recorded deadline - now) has passed. Lookups and reads are served at once.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from belugactl.dataplane import native
from belugactl.dataplane.mds.journal import HEADER as JOURNAL_HEADER

if TYPE_CHECKING:
    from belugactl.dataplane.mds.service import MetadataService
    from belugactl.pool.geometry import PoolGeometry
    from belugactl.pool.mapping import PoolMapping

FENCE_LINE = 64  # offset of the fence line inside the journal area's (otherwise unused) header
_FENCE = struct.Struct("<QQ")  # reservations may be written until (CLOCK_REALTIME ns), writer window (ns)
SLACK_NS = 1_000_000_000


class Fencing:
    def __init__(
        self,
        pool: PoolMapping,
        geometry: PoolGeometry,
        service: MetadataService,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.pool = pool
        self.service = service
        self.window_ns = int(window_s * 1e9)
        self.clock = clock
        self.wall_ns = wall_ns
        # Without a journal area there is nowhere to record deadlines: quarantine a full window.
        self.offset = geometry.journal_offset + FENCE_LINE if geometry.journal_size >= JOURNAL_HEADER else None
        self.quarantine_until = 0.0
        self.quarantine_s = 0.0
        self._recorded_until = 0

    def _read(self) -> tuple[int, int]:
        assert self.offset is not None
        if self.pool.needs_flush:
            native.flush(self.pool.buf, self.offset, _FENCE.size, True)
        return _FENCE.unpack_from(self.pool.buf, self.offset)

    def _write(self, until_ns: int) -> None:
        assert self.offset is not None
        self.pool.write(self.offset, _FENCE.pack(until_ns, self.window_ns))
        self._recorded_until = until_ns

    def start(self, previous_epoch: int) -> None:
        """After the epoch bump: quarantine what the previous incarnation may still have writers for."""
        if self.offset is None:
            wait_ns = self.window_ns if previous_epoch else 0
            until = 0
        else:
            until, window = self._read()
            left = until - self.wall_ns()
            wait_ns = max(0, min(window or self.window_ns, left)) if until else 0
        self.quarantine_s = wait_ns / 1e9
        self.quarantine_until = self.clock() + self.quarantine_s
        if self.offset is not None:
            self._write(until)  # keep the old deadline until it passes (a crash now must still honour it)
        self.service.on_reserve = self.note_reserve
        self.refresh()

    def note_reserve(self) -> None:
        """A reservation was granted: make sure the recorded deadline covers its writer."""
        if self.offset is None:
            return
        deadline = self.wall_ns() + self.window_ns
        if deadline > self._recorded_until:
            self._write(deadline + SLACK_NS)

    def remaining(self) -> float:
        return max(0.0, self.quarantine_until - self.clock())

    def refresh(self) -> None:
        left = self.remaining()
        self.service.reserve_blocked = (
            f"earlier epoch's writers may still write: RESERVE refused for {left:.1f} s" if left > 0 else ""
        )

    def clean_shutdown(self, open_reservations: int) -> None:
        """No reservation open and the server stopping: nobody can be writing; the next start need not wait."""
        if self.offset is not None and open_reservations == 0 and self.remaining() == 0:
            self._write(0)
