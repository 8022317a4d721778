"""A warm standby: the leader's index kept in step with the journal in the pool, so a takeover
serves at once instead of rebuilding (issue 32 item 1).

A cold takeover rebuilds the whole index from the journal after winning the election: parse,
allocator, index, native mirror, a compaction. At 1 M blocks that took 28 s, most of it in the
allocator's and index's own structures, not in reading the journal. A standby that follows the
journal while it waits has done all of that already; at takeover it applies what the old leader
wrote after its last step and journals on from there.

How the standby follows (`JournalFollower.step`, from a thread of the standby process):
- It reads the journal area's state word (generation, active half). While it is the one it follows,
  it applies the records appended since its last step: a COMMIT takes exactly the leader's blocks
  from its own allocator (`Allocator.take`) and enters the index (and its native mirror); a REMOVE
  removes the entry, freeing its blocks. A record torn by a write in progress does not check out
  (its crc), so the step stops there and the next one reads it whole.
- When the state word changes (the leader compacted into the other half, or a new leader started),
  it parses the whole new half and applies the difference to its index: entries gone or changed are
  removed first, then the missing ones are taken. That is O(index) once per compaction, in the standby.
- It never writes the pool: its index does not zero freed blocks (that is the leader's job), and it
  holds no lock, lease or epoch.

What makes the copy unusable (`lost`, and the takeover rebuilds cold from the journal as before): the
journal stopped or vanished under it, a record that checks out but does not parse, a block the
allocator cannot take (the journal and the copy disagree), an interleave order other than this
server's. The takeover (`finish`) runs after the election is won: the old leader's lease lapsed, so
it stopped writing before its deadline (mds/leadership.py), and the journal holds still. Then the copy
is exactly what a replay would build (tests/dataplane/test_journal_follow.py checks it against one at
random moments), the server bumps the epoch and journals on at the position the copy reached.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from belugactl.dataplane.mds.allocator import _upgrade
from belugactl.dataplane.mds.journal import (
    _REC,
    BAD_RECORD,
    COMMIT,
    NO_INTERLEAVE,
    ORDER,
    REMOVE,
    Journal,
    gc_paused,
    parse,
    read_stop,
    replay,
    replay_live,
    same_order,
)
from belugactl.dataplane.mds.removal_log import RemovalLog

# Records a step applies at most (about 10 us each): the takeover waits for at most one step.
FOLLOW_STEP = 4096


class JournalFollower:
    """Keeps `server`'s index and allocator (a server built, never started) equal to the journal's."""

    def __init__(self, server: Any) -> None:
        g = server.geometry
        self.server = server
        self.index = server.index
        self.alloc = server.allocator
        self.journal = Journal(server.pool, g.journal_offset, g.journal_size)
        a = self.alloc
        self.order = (a.ways, a.granularity) if a.ways > 1 else NO_INTERLEAVE
        self.followed: tuple[int, int] | None = None  # (generation, half) applied so far
        self.pos = 0  # where the next record of the followed half starts
        self.names: dict[bytes, str] = {}
        self.lost = ""  # why the copy cannot be used ("" while it can)
        self.applied = 0  # records applied since the start
        self.resyncs = 0  # whole halves parsed and diffed (the first sync, then one per compaction)
        self.unchecked = 0  # COMMITs without a checksum: never restored (journal.py)
        self.warm_at: float | None = None  # when a step first found nothing new (monotonic)
        self.lock = threading.Lock()
        self._zero = self.index._zero
        self.index._zero = None  # a standby never writes the pool

    # --- following ----------------------------------------------------------------------------
    def step(self, budget: int = FOLLOW_STEP) -> int:
        """Apply what the journal gained since the last step, at most `budget` records (a resync
        after the state word changed counts as one step, whatever its size). How many it applied."""
        if self.lost:
            return 0
        state = self.journal.state()
        if state is None:
            self._no_journal()
            return 0
        if state != self.followed:
            return self._resync()
        n = 0
        gen, half = state
        for body in self.journal.scan_half(gen, half, self.pos):
            if not self._apply(body):
                break
            self.pos += _REC.size + len(body)
            n += 1
            if n >= budget:
                break
        self.applied += n
        if n == 0 and self.warm_at is None:
            self.warm_at = time.monotonic()
        return n

    def _no_journal(self) -> None:
        stop = read_stop(self.server.pool.read, self.journal.offset)
        if stop is not None:
            self.lost = f"the leader's journal stopped: {stop.reason}"
        elif self.followed is not None or self.index.entries:
            self.lost = "the journal vanished from the pool"
        elif self.warm_at is None:
            self.warm_at = time.monotonic()  # nothing journaled yet: an empty index is the journal's

    def _apply(self, body: memoryview) -> bool:
        """One record into the copy; False (and `lost`) when it cannot be."""
        try:
            kind, ns, key, nbytes, blocks, crc = parse(body, self.names)
        except BAD_RECORD as exc:
            self.lost = f"a journal record checks out but does not parse ({exc})"
            return False
        if kind == ORDER:
            if not same_order(blocks[0], self.order):
                self.lost = f"the journal's interleave order {blocks[0]} is not this server's {self.order}"
                return False
            return True
        index = self.index
        nsid = index.namespaces.get(ns)
        e = index.entries.get((nsid, key)) if nsid is not None else None
        if e is not None:
            if kind == COMMIT and self._same(e, nbytes, blocks, crc):
                return True
            index.drop(e)
        if kind == REMOVE:
            return True
        if crc is None:
            self.unchecked += 1  # no reader could verify it: never served, its space stays free
            return True
        return self._enter(ns, key, nbytes, blocks, crc)

    def _enter(self, ns: str, key: bytes, nbytes: int, blocks: list[tuple[int, int]], crc: int) -> bool:
        """The leader's exact blocks into the copy; False (and `lost`) when the allocator cannot give them."""
        try:
            alloc = self.alloc.take(nbytes, blocks)
        except ValueError as exc:
            self.lost = f"the journal and the standby's allocator disagree ({exc})"
            return False
        self.index.restore([(ns, key, alloc)], [crc])
        return True

    def _same(self, e: Any, nbytes: int, blocks: list[tuple[int, int]], crc: int | None) -> bool:
        base = self.alloc.base
        return e.alloc.nbytes == nbytes and e.checksum == crc and e.alloc.blocks == [_upgrade(b, base) for b in blocks]

    def _resync(self) -> int:
        """Parse the whole active half and make the copy equal to it: removals first (so no block is
        held twice on the way), then the entries the copy lacks."""
        with gc_paused():  # as a rebuild: a first sync builds the whole copy
            return self._resync_paused()

    def _resync_paused(self) -> int:
        if not self.index.entries and not self.alloc.used:
            return self._first_sync()
        live, order = replay(self.journal)
        j = self.journal
        if j.state() != (j.generation, j.half):
            return 0  # it moved (or vanished) while being read: the next step looks again
        self.followed, self.pos = (j.generation, j.half), j.pos
        self.resyncs += 1
        if live and not same_order(order, self.order):
            self.lost = f"the journal's interleave order {order} is not this server's {self.order}"
            return 0
        index = self.index
        names = index.ns_names
        for k, e in list(index.entries.items()):
            want = live.get((names[k[0]], k[1]))
            if want is None or not self._same(e, *want):
                index.drop(e)
        checked = {k: v for k, v in live.items() if v[2] is not None}
        self.unchecked = len(live) - len(checked)
        del live
        n = 0
        for (ns, key), (nbytes, blocks, crc) in checked.items():
            nsid = index.namespaces.get(ns)
            if nsid is not None and (nsid, key) in index.entries:
                continue  # the same (a changed one was dropped above)
            if not self._enter(ns, key, nbytes, blocks, crc):
                return n
            n += 1
        self.applied += n
        return n or 1

    def _first_sync(self) -> int:
        """The first sync (an empty copy): the journal's live set (the native replay where it is
        built) into the allocator's and the index's bulk restore, as a cold start does."""
        j = self.journal
        live = replay_live(j)
        if j.state() != (j.generation, j.half):
            return 0  # it moved (or vanished) while being read: the next step looks again
        self.followed, self.pos = (j.generation, j.half), j.pos
        self.resyncs += 1
        if (live.keys or live.unchecked) and not same_order(live.order, self.order):
            self.lost = f"the journal's interleave order {live.order} is not this server's {self.order}"
            return 0
        self.unchecked = live.unchecked
        try:
            allocs = self.alloc.restore(live.shapes)
        except ValueError as exc:
            self.lost = f"journal inconsistent ({exc})"
            return 0
        self.index.restore_columns(live.names, live.ns_ids, live.keys, allocs, live.checksums)
        self.applied += len(allocs)
        return len(allocs) or 1

    def run(self, stop: threading.Event, poll_s: float, on_warm: Callable[[], None] | None = None) -> None:
        """Follow until `stop` or the copy is lost: a step, then a wait of `poll_s` when it was idle."""
        told = False
        while not stop.is_set() and not self.lost:
            with self.lock:
                n = self.step()
            if n:
                gc.freeze()  # what the copy gained joins the frozen generation, as the server's does (O(1))
            if self.warm_at is not None and not told and on_warm is not None:
                told = True
                on_warm()
            if n < FOLLOW_STEP:
                stop.wait(poll_s)

    # --- the takeover -------------------------------------------------------------------------
    def finish(self) -> bool:
        """Apply everything left (the old leader has stopped writing: the election was won), then
        hand the copy to the server: True when it is the journal's index, False when the server must
        rebuild cold (`lost` says why, or nothing was ever journaled)."""
        with self.lock:
            if not self.lost:
                self.step()  # a resync when the state word moved since the last step
            while not self.lost and self.followed is not None and self.step(1 << 30):
                pass
            self.index._zero = self._zero
            # Removal sequence numbers start at 1 with every start (a new epoch): the copy's are not the leader's.
            self.index.removals = RemovalLog(self.index.config.removal_log_size)
            return not self.lost and self.followed is not None

    def stats(self) -> dict[str, Any]:
        gen, half = self.followed if self.followed else (None, None)
        return {
            "warm": self.warm_at is not None and not self.lost,
            "lost": self.lost,
            "entries": len(self.index.entries),
            "applied": self.applied,
            "resyncs": self.resyncs,
            "generation": gen,
            "half": half,
            "position": self.pos,
        }
