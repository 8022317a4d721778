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

When the quarantine can be shorter (issue 31), and when it cannot:
- No reservation open: every reservation of this epoch ended by its owner's COMMIT (it wrote, then
  committed) or ABORT (it gave up), or was reclaimed a full TTL after it was granted (past its
  writer's deadline). Nobody may write any extent, so the recorded deadline is lowered to 0 at the
  next housekeeping (`idle`), as a clean shutdown does, and a server killed then (SIGKILL, a crash)
  is followed by one with no quarantine. A RESERVE raises the line again before its reply leaves
  (`note_reserve`, in the loop's one thread: no housekeeping runs in between), so a crash at any
  moment finds a line that covers every open reservation's writer. The line is written only when
  that changes (a reservation after an idle stretch), not per request.
- Reservations open at the crash: the quarantine stays. A re-HELLO from the rings that held them is
  not proof: `KVIndexClient.reconnect` asks its caller to drop every token first, but nothing makes
  a copy already running (another thread, a DMA on a GPU stream) finish before the HELLO goes out;
  and the old server's TCP owners come back on new connections that cannot be matched to them. A
  shorter wait would need the client to say so: a HELLO flag "no write into an earlier epoch's
  extent is in flight" sent only after its copies ended, and the old server recording which rings
  held reservations (a bitmap beside the fence line) and whether any TCP owner did. Until then the
  window is kept, bounded by the recorded deadline as before.
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

    def idle(self, open_reservations: int) -> None:
        """Housekeeping: no reservation open (and none of the previous epoch's writers left to wait
        for), so nobody may write: lower the recorded deadline to 0 (written once, when it changes)."""
        if self.offset is not None and open_reservations == 0 and self._recorded_until and self.remaining() == 0:
            self._write(0)

    def clean_shutdown(self, open_reservations: int) -> None:
        """No reservation open and the server stopping: nobody can be writing; the next start need not wait."""
        if self.offset is not None and open_reservations == 0 and self.remaining() == 0:
            self._write(0)
