"""A bounded record of the keys the index removed, so clients can follow evictions.

Why it exists: a KV-aware router (Dynamo, llm-d) learns where blocks are from vLLM's KV events. A
block the metadata server evicts from the pool must reach it as BlockRemoved, and only the server
knows when that happens. Each vLLM scheduler asks "what was removed since cursor N" now and then
(the REMOVALS op) and publishes what concerns its namespace.

Every removal gets the next sequence number (1, 2, ...). The log keeps the newest `capacity`
removals in a ring; older ones are dropped, and a client whose cursor points before the oldest one
kept is told how many it lost. Sequence numbers restart at 1 with every server start, which is also
a new pool epoch: a client's cursor is only meaningful within the epoch it was issued in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

WHY_EVICTED = 1  # watermark or make-room eviction
WHY_DELETED = 2  # DELETE of one key (e.g. a reader found the block corrupt)
WHY_CLEARED = 3  # CLEAR_NS of the whole namespace
WHY_NAMES = {WHY_EVICTED: "evicted", WHY_DELETED: "deleted", WHY_CLEARED: "cleared"}

# How many records one request may look at: a request filtering on a quiet namespace of a busy log
# moves its cursor forward in steps of this much instead of scanning the whole ring at once.
SCAN_BUDGET = 4096


@dataclass(frozen=True, slots=True)
class Removed:
    seq: int
    ns: int
    key: bytes
    why: int


class RemovalLog:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a removal log keeps at least one record, not {capacity}")
        self.capacity = capacity
        self._ring: list[tuple[int, bytes, int] | None] = [None] * capacity
        self.head = 1  # the sequence number the next removal gets

    @property
    def oldest(self) -> int:
        """The oldest sequence number still kept (== head when the log is empty)."""
        return max(1, self.head - self.capacity)

    def __len__(self) -> int:
        return self.head - self.oldest

    def record(self, ns: int, key: bytes, why: int) -> None:
        self._ring[self.head % self.capacity] = (ns, key, why)
        self.head += 1

    def lost_before(self, cursor: int) -> int:
        """How many removals at or after `cursor` were dropped before it was asked for (0 and 1
        both mean "from the first removal")."""
        return max(0, self.oldest - max(cursor, 1))

    def window(self, cursor: int, budget: int = SCAN_BUDGET) -> tuple[int, int]:
        """The sequence numbers [start, stop) one request looks at from `cursor`: what is still
        kept, at most `budget` records (a quiet namespace in a busy log moves in such steps)."""
        start = max(cursor, self.oldest)
        return start, min(self.head, start + max(0, budget))

    def records(self, start: int, stop: int, ns: int = 0) -> Iterator[Removed]:
        """The kept removals with start <= seq < stop, in order, of namespace `ns` (0: all)."""
        ring, cap = self._ring, self.capacity
        for seq in range(max(start, self.oldest), min(stop, self.head)):
            rec = ring[seq % cap]
            if rec is not None and (not ns or rec[0] == ns):
                yield Removed(seq, rec[0], rec[1], rec[2])
