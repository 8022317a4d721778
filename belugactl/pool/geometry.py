"""The pool's geometry: where the RPC rings, the journal and the shared KV area lie, and how big the pool is.

One type for every user. The layout (model/layout.py, derived from the manifest) produces it when
the header is built; the header on media carries it; a mapping reads it back from the header.
Every offset the data plane computes from it goes through `slot_offset` / `ring_offset` here,
bounds-checked, and a geometry that could not be served (zero slots per ring, rings that overlap,
an area past the end of the pool) is refused when it is built, as a `PoolMismatch` that says
which field is wrong, instead of a ZeroDivisionError or a write into another host's partition later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from belugactl.errors import PoolMismatch

if TYPE_CHECKING:
    from belugactl.model.layout import PoolLayout

CACHE_LINE = 64  # RPC slots hold REQ_READY / RESP_READY words: a slot must not share a line with another
# The header's own region at offset 0: every layout reserves at least this (a positive multiple of the
# devdax align, itself 2 MiB or 1 GiB). An area inside it would be written over the magic, the claim
# or the epoch word (a client's HELLO in a ring at offset 0 overwrote the magic).
HEADER_REGION = 2 << 20
# The doorbells (docs/pool-format.md, "Doorbells"): one byte per ring from this offset, 64 rings to a
# cache line, in the header region's second MiB, which the header record (at most 1408 bytes) never
# reaches and which every layout already reserves and never wrote: old pools need no new space, and
# their area reads as "no ring rang yet".
DOORBELL_OFFSET = 1 << 20
DOORBELL_MAX_RINGS = HEADER_REGION - DOORBELL_OFFSET


@dataclass(frozen=True)
class PoolGeometry:
    pool_size: int
    rpc_offset: int
    ring_count: int
    slots_per_ring: int
    slot_size: int
    ring_stride: int
    journal_offset: int
    journal_size: int
    shared_kv_offset: int
    shared_kv_size: int

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise PoolMismatch(
                f"pool geometry: {problem}",
                why="the pool's RPC rings, journal and shared KV area must lie inside the pool without overlapping",
                fix="the header was written by a different or broken tool, or the bytes are corrupted: "
                "re-initialize the pool with `belugactl setup --force` (destroys its contents) if no host uses it",
            )

    def _problem(self) -> str | None:
        for name in type(self).__dataclass_fields__:
            if getattr(self, name) < 0:
                return f"{name} is negative ({getattr(self, name)})"
        if self.slots_per_ring < 1:
            return f"a ring has {self.slots_per_ring} slots; it needs at least one"
        if self.slot_size < CACHE_LINE or self.slot_size % CACHE_LINE:
            return f"slot size {self.slot_size} is not a positive multiple of the {CACHE_LINE} B cache line"
        if self.ring_stride < self.slots_per_ring * self.slot_size:
            return (
                f"ring stride {self.ring_stride} is smaller than {self.slots_per_ring} slots of {self.slot_size} B: "
                "rings would overlap"
            )
        areas = (
            ("rpc area", self.rpc_offset, self.ring_count * self.ring_stride),
            ("journal", self.journal_offset, self.journal_size),
            ("shared KV area", self.shared_kv_offset, self.shared_kv_size),
        )
        for what, offset, size in areas:
            if size and offset < HEADER_REGION:
                return f"the {what} starts at {offset}, inside the header region (the first {HEADER_REGION} bytes)"
            if offset + size > self.pool_size:
                return f"the {what} ends at {offset + size}, past the pool size {self.pool_size}"
        spans = sorted((offset, offset + size, what) for what, offset, size in areas if size)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            if start < end:
                return f"the {first} (to {end}) overlaps the {second} (from {start})"
        return None

    @classmethod
    def from_layout(cls, layout: PoolLayout) -> PoolGeometry:
        """The geometry the manifest's layout implies: what setup writes into the header."""
        return cls(
            pool_size=layout.pool_size,
            rpc_offset=layout.rpc.offset,
            ring_count=layout.rpc.ring_count,
            slots_per_ring=layout.rpc.slots_per_ring,
            slot_size=layout.rpc.slot_size,
            ring_stride=layout.rpc.ring_stride,
            journal_offset=layout.journal.offset,
            journal_size=layout.journal.size,
            shared_kv_offset=layout.shared_kv.offset,
            shared_kv_size=layout.shared_kv.size,
        )

    @property
    def doorbell_size(self) -> int:
        """The doorbell area's bytes: a byte per ring, rounded up to whole cache lines."""
        return -(-self.ring_count // CACHE_LINE) * CACHE_LINE

    @property
    def has_doorbells(self) -> bool:
        """Whether the rings have doorbells: at most DOORBELL_MAX_RINGS rings, in a pool that holds
        the header region (a smaller one, only in tests, is served by the sweep alone)."""
        return 0 < self.ring_count <= DOORBELL_MAX_RINGS and self.pool_size >= DOORBELL_OFFSET + self.doorbell_size

    def doorbell_offset(self, ring: int) -> int:
        """The pool offset of ring `ring`'s doorbell byte."""
        if not 0 <= ring < self.ring_count or not self.has_doorbells:
            raise IndexError(f"ring {ring} has no doorbell (rings 0..{self.ring_count - 1})")
        return DOORBELL_OFFSET + ring

    @property
    def rpc_size(self) -> int:
        return self.ring_count * self.ring_stride

    def ring_offset(self, ring: int) -> int:
        if not 0 <= ring < self.ring_count:
            raise IndexError(f"ring {ring} out of range 0..{self.ring_count - 1}")
        return self.rpc_offset + ring * self.ring_stride

    def slot_offset(self, ring: int, slot: int) -> int:
        if not 0 <= slot < self.slots_per_ring:
            raise IndexError(f"slot {slot} out of range 0..{self.slots_per_ring - 1}")
        return self.ring_offset(ring) + slot * self.slot_size
