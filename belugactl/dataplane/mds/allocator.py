"""Segregated-fit allocator over the shared KV area.

The area is cut into 2 MiB chunks (the devdax alignment). A request of up to half a chunk gets
one block of the smallest size class that holds it; classes are 4 KiB-aligned sizes in steps of
2^k and 1.5 * 2^k, so a block wastes at most a third of itself. Larger requests take whole chunks
for the bulk and one class block for the tail (or one more chunk), coalescing adjacent chunks so a
mostly-empty pool answers with one extent. There is no class above half a chunk: such a block
would sit alone in its chunk, and its footprint would under-report the space it keeps from others.

A class carves chunks as it needs them and gives a chunk back to the free chunks as soon as its
last block is freed, so space one block size used is reusable by any other size (a chunk that
stayed with its class would starve every other size once one size had carved the whole area).
Each class keeps its partly free chunks in a dict chunk -> free offsets, so alloc, free and the
return of an empty chunk are all O(1).

Software interleave (manifest `pool.interleave.mode: software`): the area is split into `ways`
equal zones, each a whole number of granules and starting at a pool offset that is a multiple of
`granularity`, and consecutive allocations start in consecutive zones, round-robin. A multi-chunk
allocation changes zone every `granularity` bytes (its tail goes on in the zone after its last
whole granule), so a block of `ways` granules puts one granule in every zone. Equal zones keep
the rotation even; the area's ends that do not make a whole granule in every zone (less than
`granularity` before the first zone, less than `ways` granules after the last) are left unused
and reported (`stats()["interleave"]["unused_bytes"]`). When the zone whose turn it is has no
room the next zone with room answers, so interleave never turns a fitting request into a failure.

Quarantine (poisoned lines, mds/poison.py): `quarantine(offset, length)` takes every chunk the range
touches out of use for good, rounded out to the chunk (the allocator's unit: a 64-byte poisoned line
costs 2 MiB). A free chunk is skipped when its turn comes (never handed out again); a chunk in use
keeps its live blocks, hands out no more of them, and its blocks are not given back when freed.
`free_chunk_count` stays exact (the skipped chunks are not counted), so `alloc` and the eviction
planner never count on a quarantined chunk.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence

from belugactl.dataplane import native

CHUNK = 2 << 20
MIN_BLOCK = 4 << 10
# Maps and sets over chunks key them by chunk number (offset >> CHUNK_SHIFT; the area starts on a
# chunk boundary, so it names each chunk once), and the index keys blocks by offset >> BLOCK_SHIFT.
# A CPython dict places an int key by its low bits, and an offset's low 21 (or 12) bits are all zero:
# every key then starts its probe in one of a few slots, and at millions of keys an insert cost 0.9 us
# instead of 0.15 (docs/measurements.md, 2026-12-07, session 18).
CHUNK_SHIFT = 21
BLOCK_SHIFT = 12
assert CHUNK == 1 << CHUNK_SHIFT and MIN_BLOCK == 1 << BLOCK_SHIFT


def _size_classes() -> list[int]:
    sizes: set[int] = set()
    s = MIN_BLOCK
    # Classes stop at half a chunk: a larger block would be alone in its chunk anyway.
    while s <= CHUNK // 2:
        sizes.add(s)
        mid = s + s // 2
        if mid <= CHUNK // 2 and mid % MIN_BLOCK == 0:
            sizes.add(mid)
        s *= 2
    return sorted(sizes)


SIZE_CLASSES: tuple[int, ...] = tuple(_size_classes())
_CLASSES = frozenset(SIZE_CLASSES)
_CLASS_CODE = {c: i + 1 for i, c in enumerate(SIZE_CLASSES)}  # a chunk's class as one byte (restore)
_WHOLE = 255  # ... and a chunk held whole by one block
assert len(SIZE_CLASSES) < _WHOLE

Extent = tuple[int, int]
Block = tuple[int, int]  # (class size, or CHUNK for a whole chunk; offset)

# The native restore of whole-chunk blocks (_native_restore.c); None where the helper is not built.
_restore_chunks = native.optional("alloc_restore_chunks")
_TRIPLE = struct.Struct("<QQQ")


class PackedShapes(Sequence[tuple[int, list[Block]]]):
    """Many journal records' blocks as the native replay gives them, without a Python object a record:
    `one` holds a u64 triple (nbytes, class size, offset) per record; a record of several blocks (or
    of one block of size 0, which no class has) has size 0 and, for offset, its place in `multi` (its
    (size, offset) blocks). Read as a sequence it gives each record's (nbytes, blocks), as the Python
    replay's list does; a place outside `multi` is a ValueError (the bytes are a journal's)."""

    __slots__ = ("one", "multi")

    def __init__(self, one: bytes, multi: list[list[Block]]) -> None:
        if len(one) % _TRIPLE.size:
            raise ValueError(f"packed shapes of {len(one)} bytes: not whole (nbytes, size, offset) triples")
        self.one, self.multi = one, multi

    @classmethod
    def pack(cls, shapes: Iterable[tuple[int, list[Block]]]) -> PackedShapes:
        one, multi = bytearray(), []
        for nbytes, blocks in shapes:
            if len(blocks) == 1 and blocks[0][0] != 0:
                one += _TRIPLE.pack(nbytes, *blocks[0])
            else:
                one += _TRIPLE.pack(nbytes, 0, len(multi))
                multi.append(list(blocks))
        return cls(bytes(one), multi)

    def __len__(self) -> int:
        return len(self.one) // _TRIPLE.size

    def __getitem__(self, i: int) -> tuple[int, list[Block]]:  # type: ignore[override]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"packed shapes: record {i} of {n}")
        nbytes, size, off = _TRIPLE.unpack_from(self.one, _TRIPLE.size * (i % n))
        return (nbytes, self._several(off)) if size == 0 else (nbytes, [(size, off)])

    def __iter__(self) -> Iterator[tuple[int, list[Block]]]:
        several = self._several
        for nbytes, size, off in _TRIPLE.iter_unpack(self.one):
            yield (nbytes, several(off)) if size == 0 else (nbytes, [(size, off)])

    def _several(self, at: int) -> list[Block]:
        if at >= len(self.multi):
            raise ValueError(f"packed shapes: a record names block list {at} of {len(self.multi)}")
        return self.multi[at]


class Allocation:
    """What one reservation holds: the extents handed out, and the blocks to give back.

    Most allocations are one block: those keep its offset and class size alone (two ints, no lists),
    and `extents` and `blocks` are made when read. At millions of blocks the lists and tuples were a
    third of the index's Python bytes a block (docs/measurements.md, 2026-12-07)."""

    __slots__ = ("nbytes", "_a", "_b")

    def __init__(self, extents: list[Extent], blocks: list[Block], nbytes: int) -> None:
        self.nbytes = nbytes
        if len(blocks) == 1 and [(blocks[0][1], min(blocks[0][0], nbytes))] == extents:
            self._a, self._b = blocks[0][1], blocks[0][0]  # offset, class size
        else:
            self._a, self._b = extents, blocks

    @classmethod
    def one(cls, off: int, size: int, nbytes: int) -> Allocation:
        """One block of class `size` at `off` holding `nbytes` (at most `size`)."""
        a = cls.__new__(cls)
        a.nbytes, a._a, a._b = nbytes, off, size
        return a

    @property
    def extents(self) -> list[Extent]:
        a = self._a
        if type(a) is int:
            size = self._b
            return [(a, size if size < self.nbytes else self.nbytes)]  # type: ignore[list-item, operator]
        return a  # type: ignore[return-value]

    @property
    def blocks(self) -> list[Block]:
        a = self._a
        if type(a) is int:
            return [(self._b, a)]  # type: ignore[list-item]
        return self._b  # type: ignore[return-value]

    @property
    def single(self) -> Block | None:
        """(class size, offset) of a one-block allocation, read without making lists; None for several."""
        a = self._a
        return (self._b, a) if type(a) is int else None  # type: ignore[return-value]

    @staticmethod
    def not_one_chunk(allocs: Sequence[Allocation]) -> list[int]:
        """The positions of the allocations that are not one whole chunk (a smaller block, or several
        blocks): what a restore of millions of 2 MiB blocks has to look at, found without a call each."""
        return [i for i, a in enumerate(allocs) if a._b != CHUNK]

    @property
    def footprint(self) -> int:
        a = self._a
        if type(a) is int:
            return self._b  # type: ignore[return-value]
        return sum(size for size, _ in self._b)  # type: ignore[union-attr]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Allocation):
            return NotImplemented
        return (self.extents, self.blocks, self.nbytes) == (other.extents, other.blocks, other.nbytes)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, compared by value (as the dataclass was)

    def __repr__(self) -> str:
        return f"Allocation(extents={self.extents!r}, blocks={self.blocks!r}, nbytes={self.nbytes!r})"


class _Zone:
    """One interleave zone's chunks: a bump pointer over chunks never handed out, and a stack of
    chunks given back (an 8 TiB area has 4 million chunks, too many to list up front).

    `stacked` says which chunks on the stack are free: a chunk a standby's `Allocator.take` claims
    from the middle of the stack leaves only the set, and its place on the list is passed over. The
    list holds chunk offsets; the sets hold chunk numbers (CHUNK_SHIFT)."""

    __slots__ = ("start", "end", "fresh", "free", "skip", "stacked")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end, self.fresh = start, end, start
        self.free: list[int] = []
        self.stacked: set[int] = set()
        # Quarantined chunks that are still among the free ones (on the stack or not yet reached
        # by the bump pointer): not counted, and passed over when their turn comes.
        self.skip: set[int] = set()

    @property
    def count(self) -> int:
        return len(self.stacked) + (self.end - self.fresh) // CHUNK - len(self.skip)

    def push(self, chunk: int) -> None:
        self.free.append(chunk)
        self.stacked.add(chunk >> CHUNK_SHIFT)

    def pop(self) -> int | None:
        skip = self.skip
        stacked = self.stacked
        while self.free:
            chunk = self.free.pop()
            n = chunk >> CHUNK_SHIFT
            if n not in stacked:
                continue  # claimed by `take` while on the stack
            stacked.discard(n)
            if not skip or n not in skip:
                return chunk
            skip.discard(n)
        while self.fresh < self.end:
            chunk = self.fresh
            self.fresh += CHUNK
            if not skip or chunk >> CHUNK_SHIFT not in skip:
                return chunk
            skip.discard(chunk >> CHUNK_SHIFT)
        return None


class Allocator:
    def __init__(self, base: int, size: int, *, ways: int = 1, granularity: int = CHUNK) -> None:
        if base % CHUNK:
            raise ValueError(f"shared KV area offset {base:#x} is not 2 MiB aligned")
        self.base = base
        self.area_size = size
        self.used = 0  # bytes in blocks handed out (footprint)
        self.requested = 0  # bytes callers asked for
        self.chunks_returned = 0  # carved chunks given back to the free chunks when they emptied
        # Quarantined chunk -> the class it was carved for (CHUNK: whole, or in use with its class
        # not known yet; 0: nothing left to account). Their blocks never come back (mds/poison.py).
        self.quarantined: dict[int, int] = {}
        self.set_interleave(ways, granularity)

    def set_interleave(self, ways: int, granularity: int = CHUNK) -> None:
        """Place allocations round-robin over `ways` zones (software interleave); only while empty."""
        if ways < 1:
            raise ValueError("interleave ways must be at least 1")
        if granularity < CHUNK or granularity % CHUNK:
            raise ValueError(f"interleave granularity {granularity} is not a multiple of 2 MiB")
        if self.used or self.quarantined:
            raise ValueError("the interleave of an allocator in use (or with a quarantine) cannot change")
        area_end = self.base + self.area_size - self.area_size % CHUNK
        start = min(-(-self.base // granularity) * granularity, area_end)  # the first granule boundary
        granules = (area_end - start) // granularity
        # Fewer granules than ways: as many zones as there are granules.
        ways = min(ways, granules)
        if ways <= 1:
            ways, start, zone_size = 1, self.base, area_end - self.base  # one zone: the whole area
        else:
            zone_size = (granules // ways) * granularity
        self.ways = ways
        self.granularity = granularity
        self.zone_size = zone_size
        self.zones_start = start
        self.chunks = ways * zone_size // CHUNK
        self.capacity = self.chunks * CHUNK
        self.unused_bytes = self.area_size - self.capacity  # the area's ends outside every zone
        self._zones = [_Zone(start + z * zone_size, start + (z + 1) * zone_size) for z in range(ways)]
        self._rr = 0  # zone whose turn is next
        # Per class, per zone: chunk number -> offsets of its free blocks (chunks with no free
        # block are in no dict; they come back on the first free).
        self._partial: dict[int, list[dict[int, list[int]]]] = {c: [{} for _ in range(self.ways)] for c in SIZE_CLASSES}
        self._carved: dict[int, int] = dict.fromkeys(SIZE_CLASSES, 0)  # chunks per class
        self._zone_used = [0] * self.ways

    @staticmethod
    def class_for(nbytes: int) -> int:
        # Linear over ~20 sizes is cheaper than bisect's call overhead here and stays O(1).
        for c in SIZE_CLASSES:
            if c >= nbytes:
                return c
        raise ValueError(f"{nbytes} bytes is above the largest size class")

    @staticmethod
    def shape(nbytes: int) -> tuple[int, int]:
        """(whole chunks, tail class size or 0) that a request of `nbytes` takes."""
        whole, tail = divmod(nbytes, CHUNK)
        if tail > SIZE_CLASSES[-1]:
            return whole + 1, 0
        return whole, (Allocator.class_for(tail) if tail else 0)

    def zone_of(self, offset: int) -> int:
        return min((offset - self.zones_start) // self.zone_size, self.ways - 1) if self.zone_size else 0

    def zone_ranges(self) -> list[tuple[int, int]]:
        """(start offset, size) of every interleave zone, in zone order."""
        return [(z.start, z.end - z.start) for z in self._zones]

    def _chunk_of(self, offset: int) -> int:
        return offset - (offset - self.base) % CHUNK

    @property
    def free_chunk_count(self) -> int:
        return sum(z.count for z in self._zones)

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    def _pop_chunk(self, zone: int) -> int | None:
        """A free chunk, from `zone` when it has one, else from the next zone that does."""
        for i in range(self.ways):
            chunk = self._zones[(zone + i) % self.ways].pop()
            if chunk is not None:
                return chunk
        return None

    def _take_block(self, cls: int, zone: int) -> int | None:
        """A block of `cls`: from `zone` (a partly free chunk, else a fresh carve), else from the
        next zone that has either."""
        per_zone = self._partial[cls]
        for i in range(self.ways):
            z = (zone + i) % self.ways
            partial = per_zone[z]
            if partial:
                # The most recently touched chunk: filling few chunks lets the others drain empty.
                n, free = partial.popitem()
                off = free.pop()
                if free:
                    partial[n] = free
                return off
            chunk = self._zones[z].pop()
            if chunk is not None:
                self._carved[cls] += 1
                # Highest first so pop() yields ascending offsets; the first block is handed out.
                partial[chunk >> CHUNK_SHIFT] = [chunk + j * cls for j in range(CHUNK // cls - 1, 0, -1)]
                return chunk
        return None

    def alloc(self, nbytes: int) -> Allocation | None:
        """Blocks for `nbytes`, or None (nothing taken) when the area cannot hold them."""
        if nbytes <= 0:
            raise ValueError("allocation size must be positive")
        whole, cls = self.shape(nbytes)
        zone = start = self._rr
        if not whole:  # one class block (most requests): no lists made
            off = self._take_block(cls, zone)
            if off is None:
                return None
            self._rr = (start + 1) % self.ways
            self._zone_used[self.zone_of(off)] += cls
            self.used += cls
            self.requested += nbytes
            return Allocation.one(off, cls, nbytes)
        blocks: list[Block] = []
        if whole:
            if whole > self.free_chunk_count:
                return None
            per_granule = self.granularity // CHUNK
            for first in range(0, whole, per_granule):
                if first:
                    zone = (zone + 1) % self.ways
                # One granule's chunks, lowest first so that neighbours coalesce into one extent.
                granule = sorted(self._pop_chunk(zone) for _ in range(min(per_granule, whole - first)))  # type: ignore[type-var]
                blocks.extend((CHUNK, off) for off in granule)  # type: ignore[misc]
            if cls:
                zone = (zone + 1) % self.ways if whole % per_granule == 0 else zone
        if cls:
            off = self._take_block(cls, zone)
            if off is None:
                self._give_back(blocks)
                return None
            blocks.append((cls, off))
        # The next allocation starts one zone on, however many zones this one spans: a run of
        # equal multi-zone blocks then rotates through every zone instead of a fixed subset.
        self._rr = (start + 1) % self.ways
        footprint = 0
        zone_used = self._zone_used
        for size, off in blocks:
            footprint += size
            zone_used[self.zone_of(off)] += size
        self.used += footprint
        self.requested += nbytes
        return Allocation(_coalesce(blocks, nbytes, in_order=self.ways > 1), blocks, nbytes)

    def free(self, allocation: Allocation) -> None:
        blocks = allocation.blocks  # made once: a one-block allocation builds its list when read
        self._give_back(blocks)
        zone_used = self._zone_used
        for size, off in blocks:
            zone_used[self.zone_of(off)] -= size
        self.used -= allocation.footprint
        self.requested -= allocation.nbytes

    def _give_back(self, blocks: list[Block]) -> None:
        quarantined = self.quarantined
        for size, off in blocks:
            if quarantined and self._chunk_of(off) in quarantined:
                self._retire(size, self._chunk_of(off))
                continue
            if size == CHUNK:
                self._zones[self.zone_of(off)].push(off)
                continue
            chunk = self._chunk_of(off)
            partial = self._partial[size][self.zone_of(chunk)]
            n = chunk >> CHUNK_SHIFT
            free = partial.get(n)
            if free is None:
                free = partial[n] = []
            free.append(off)
            if len(free) == CHUNK // size:
                # Its last block came back: the chunk is free for any size again.
                del partial[n]
                self._carved[size] -= 1
                self._zones[self.zone_of(chunk)].push(chunk)
                self.chunks_returned += 1

    # --- quarantine (poisoned lines) ----------------------------------------------------------
    def quarantine(self, offset: int, length: int) -> tuple[list[int], list[int]]:
        """Take every chunk that [offset, offset + length) touches out of use for good. Returns the
        chunks newly quarantined and, of those, the ones in use (blocks on them may hold data: the
        caller looks for them). The part of the range outside the zones is ignored (the caller says so).

        O(chunks in the range), plus one pass over a zone's stack of free chunks when a chunk below
        its bump pointer is quarantined."""
        new: list[int] = []
        in_use: list[int] = []
        lo = max(offset, self.zones_start)
        hi = min(offset + max(length, 0), self.zones_start + self.capacity)
        if lo >= hi:
            return new, in_use
        for chunk in range(self._chunk_of(lo), hi, CHUNK):
            if chunk in self.quarantined:
                continue
            z = self.zone_of(chunk)
            zone = self._zones[z]
            if chunk >= zone.fresh:
                zone.skip.add(chunk >> CHUNK_SHIFT)  # free, never handed out: passed over when reached
                self.quarantined[chunk] = 0
            else:
                if chunk >> CHUNK_SHIFT in zone.stacked:
                    zone.skip.add(chunk >> CHUNK_SHIFT)  # free on the stack: passed over when popped
                    self.quarantined[chunk] = 0
                else:
                    self.quarantined[chunk] = self._stop_carving(chunk, z)
                    in_use.append(chunk)
            new.append(chunk)
        return new, in_use

    def _stop_carving(self, chunk: int, zone: int) -> int:
        """A chunk in use: no more blocks from it. Its class when it had free blocks (it is no longer
        carved for that class), else CHUNK (a whole-chunk block, or a class not known until a block
        of it is freed)."""
        for cls in SIZE_CLASSES:
            if self._partial[cls][zone].pop(chunk >> CHUNK_SHIFT, None) is not None:
                self._carved[cls] -= 1
                return 0
        return CHUNK

    def _retire(self, size: int, chunk: int) -> None:
        """A block of a quarantined chunk was freed: it stays out of use; the chunk's class stops
        counting it as carved the first time one of its class blocks comes back."""
        if size != CHUNK and self.quarantined.get(chunk) == CHUNK:
            self._carved[size] -= 1
            self.quarantined[chunk] = 0

    @property
    def quarantined_bytes(self) -> int:
        return len(self.quarantined) * CHUNK

    # --- what eviction would achieve -----------------------------------------------------------
    def fit_planner(self, nbytes: int) -> FitPlanner:
        """A what-if for eviction: feed it the blocks of eviction candidates, coldest first, and it
        says when freeing them would let `nbytes` allocate (nothing is changed meanwhile)."""
        return FitPlanner(self, nbytes)

    def can_ever_fit(self, nbytes: int) -> bool:
        """Whether `nbytes` fits an empty area of this size (whatever eviction would free)."""
        whole, cls = self.shape(nbytes)
        return whole + (1 if cls else 0) <= self.chunks - len(self.quarantined)

    # --- restart --------------------------------------------------------------------------------
    def restore(self, allocations: Sequence[tuple[int, list[Block]]]) -> list[Allocation]:
        """Rebuild a fresh allocator's state from the live blocks of a journal: (nbytes, blocks) each
        (a list, or the native replay's PackedShapes, whose one-block whole chunks are restored in C).

        Raises ValueError (nothing changed) when the blocks are inconsistent: outside the area,
        misaligned, overlapping, or two classes in one chunk. A block of a size class this version
        no longer has (above half a chunk) that starts a chunk is taken as the whole chunk.
        """
        if self.used or self.quarantined:
            raise ValueError("restore needs an empty allocator (restore first, then quarantine)")
        if isinstance(allocations, PackedShapes) and _restore_chunks is not None:
            try:
                return self._restore(allocations, fast=True)
            except ValueError:
                pass  # inconsistent: the records again in journal order, so the error names the first bad one
        return self._restore(allocations, fast=False)

    def _restore(self, allocations: Sequence[tuple[int, list[Block]]], *, fast: bool) -> list[Allocation]:
        """`restore`'s work; changes nothing before every record is checked (a ValueError leaves the
        allocator as it was). `fast`: the whole chunks of PackedShapes checked and made in C first."""
        base = self.base
        start, end = self.zones_start, self.zones_start + self.capacity
        first = start >> CHUNK_SHIFT  # the zones' first chunk number
        # Each chunk of the zones, by number from `first`: 0 free, _WHOLE held by one block, else the
        # index + 1 of the class its blocks are carved for (a byte a chunk: 4 MB for 8 TiB, where a
        # dict of millions of chunks cost most of a restart's allocator time).
        state = bytearray(self.chunks)
        small: dict[int, int] = {}  # chunk number -> class size, for the chunks carved into blocks
        taken: set[int] = set()  # blocks smaller than a chunk, by offset >> BLOCK_SHIFT
        codes = _CLASS_CODE
        take = taken.add

        def check(size: int, off: int) -> None:
            """A block of a class, inside the area, aligned, alone in its place and in a chunk of its class."""
            chunk = off - (off - base) % CHUNK
            if size == CHUNK:  # a whole chunk: nothing else in it (as in the one-block case below)
                if off != chunk or not start <= off < end or state[(off >> CHUNK_SHIFT) - first]:
                    raise ValueError(f"block ({size}, {off:#x}) is outside the area, misaligned or duplicated")
                state[(off >> CHUNK_SHIFT) - first] = _WHOLE
                return
            code = codes.get(size)
            if not start <= off < end or code is None:
                raise ValueError(f"block ({size}, {off:#x}) is outside the area, unknown or duplicated")
            if (off - chunk) % size or off - chunk + size > CHUNK:
                raise ValueError(f"block ({size}, {off:#x}) is not aligned to its class")
            if off >> BLOCK_SHIFT in taken:  # aligned, so its 4 KiB number names it alone
                raise ValueError(f"block ({size}, {off:#x}) is outside the area, unknown or duplicated")
            i = (chunk >> CHUNK_SHIFT) - first
            was = state[i]
            if was != code:
                if was:
                    raise ValueError(f"chunk {chunk:#x} holds blocks of two sizes")
                state[i] = code
                small[chunk >> CHUNK_SHIFT] = size
            take(off >> BLOCK_SHIFT)

        # One pass, checks and the Allocation together (a restart walks millions); a one-block
        # record, most of them, without lists.
        in_order = zoned = self.ways > 1  # one zone: every block counts in zone 0
        zone_used, zone_of = array("q", bytes(8 * len(self._zone_used))), self.zone_of  # applied once all checked
        todo: Iterable[tuple[int, tuple[int, list[Block]]]]
        if fast:
            assert isinstance(allocations, PackedShapes) and _restore_chunks is not None
            # The one-block whole chunks (a restart of 2 MiB blocks: all of them) checked and made in C,
            # as the loop below would; the loop takes the rest, by place.
            restored, rest, used, requested = _restore_chunks(
                allocations.one, state, Allocation, base, start, end, CHUNK, self.ways, self.zone_size, zone_used
            )
            todo = ((i, allocations[i]) for i in rest)
        else:
            restored, used, requested = [None] * len(allocations), 0, 0
            todo = enumerate(allocations)
        one = Allocation.one
        classes = _CLASSES
        for at, (nbytes, blocks) in todo:
            requested += nbytes
            if len(blocks) == 1:
                size, off = blocks[0]
                if size != CHUNK and size not in classes:
                    size, off = _upgrade((size, off), base)
                if size == CHUNK:
                    if (off - base) % CHUNK or not start <= off < end or state[(off >> CHUNK_SHIFT) - first]:
                        raise ValueError(f"block ({size}, {off:#x}) is outside the area, misaligned or duplicated")
                    state[(off >> CHUNK_SHIFT) - first] = _WHOLE
                else:
                    check(size, off)
                restored[at] = one(off, size, nbytes)
                used += size
                if zoned:
                    zone_used[zone_of(off)] += size
                continue
            blocks = [_upgrade(b, base) for b in blocks]
            for size, off in blocks:
                check(size, off)
                used += size
                if zoned:
                    zone_used[zone_of(off)] += size
            restored[at] = Allocation(_coalesce(blocks, nbytes, in_order=in_order), blocks, nbytes)
        for zone in self._zones:
            lo = (zone.start >> CHUNK_SHIFT) - first
            chunks = state[lo : lo + (zone.end - zone.start) // CHUNK]
            held_to = len(chunks.rstrip(b"\0"))  # chunks above the highest held stay fresh
            zone.fresh = zone.start + held_to * CHUNK
            free: list[int] = []
            if chunks.count(0, 0, held_to):  # else every chunk below the top is held (a full cache)
                i = chunks.find(0, 0, held_to)
                while i >= 0:
                    free.append(zone.start + i * CHUNK)
                    i = chunks.find(0, i + 1, held_to)
                free.reverse()  # the lowest chunk is popped first
            zone.free = free
            zone.stacked = {c >> CHUNK_SHIFT for c in free}
        for n, size in small.items():
            chunk = n << CHUNK_SHIFT
            self._carved[size] += 1
            count = CHUNK // size
            left = [o for o in (chunk + i * size for i in range(count - 1, -1, -1)) if o >> BLOCK_SHIFT not in taken]
            if left:
                self._partial[size][self.zone_of(chunk)][n] = left
        if not zoned:
            zone_used[0] += used
        for i, n in enumerate(zone_used):
            self._zone_used[i] += n
        self.used += used
        self.requested += requested
        return restored  # type: ignore[return-value]  # every place is filled by now

    # --- a standby following the leader's journal (mds/journal_follow.py) ---------------------------
    def take(self, nbytes: int, blocks: list[Block]) -> Allocation:
        """Hand out exactly `blocks` for `nbytes`, as the leader did: what a standby does with each
        COMMIT it reads. ValueError (nothing changed) when a block is outside the area, misaligned, of
        a size this version has no class for, or not free. O(blocks), plus O(chunk's blocks) to take
        one out of a partly free chunk."""
        blocks = [_upgrade(b, self.base) for b in blocks]
        done: list[Block] = []
        try:
            for size, off in blocks:
                self._take_one(size, off)
                done.append((size, off))
        except ValueError:
            self._give_back(done)
            raise
        zone_used = self._zone_used
        footprint = 0
        for size, off in blocks:
            footprint += size
            zone_used[self.zone_of(off)] += size
        self.used += footprint
        self.requested += nbytes
        return Allocation(_coalesce(list(blocks), nbytes, in_order=self.ways > 1), list(blocks), nbytes)

    def _take_one(self, size: int, off: int) -> None:
        chunk = self._chunk_of(off)
        end = self.zones_start + self.capacity
        if not self.zones_start <= off < end or (size != CHUNK and size not in _CLASSES):
            raise ValueError(f"block ({size}, {off:#x}) is outside the area or of an unknown size")
        if (off - chunk) % size or off - chunk + size > CHUNK:
            raise ValueError(f"block ({size}, {off:#x}) is not aligned to its class")
        z = self.zone_of(chunk)
        if size != CHUNK:
            partial = self._partial[size][z]
            free = partial.get(chunk >> CHUNK_SHIFT)
            if free is not None:
                if off not in free:
                    raise ValueError(f"block ({size}, {off:#x}) is in use")
                free.remove(off)
                if not free:
                    del partial[chunk >> CHUNK_SHIFT]
                return
        if not self._claim_chunk(chunk, z):
            raise ValueError(f"block ({size}, {off:#x}): its chunk is in use")
        if size != CHUNK:
            self._carved[size] += 1
            rest = [chunk + j * size for j in range(CHUNK // size - 1, -1, -1) if chunk + j * size != off]
            if rest:
                self._partial[size][z][chunk >> CHUNK_SHIFT] = rest

    def _claim_chunk(self, chunk: int, z: int) -> bool:
        """Take `chunk` out of the free chunks; False when it is not free."""
        zone = self._zones[z]
        n = chunk >> CHUNK_SHIFT
        if n in zone.skip:
            return False
        if chunk >= zone.fresh:
            for c in range(zone.fresh, chunk, CHUNK):  # passed over by the bump pointer: free
                zone.push(c)
            zone.fresh = chunk + CHUNK
            return True
        if n in zone.stacked:
            zone.stacked.discard(n)
            return True
        return False

    # --- numbers ----------------------------------------------------------------------------------
    def zone_bytes(self) -> list[int]:
        """Bytes handed out per interleave zone (one zone without software interleave)."""
        return list(self._zone_used)

    def stats(self) -> dict[str, object]:
        free_blocks = {c: sum(len(f) for zone in self._partial[c] for f in zone.values()) for c in SIZE_CLASSES}
        carved_idle = sum(n * c for c, n in free_blocks.items())
        return {
            "capacity": self.capacity,
            "used": self.used,
            "requested": self.requested,
            "free": self.capacity - self.used,
            "utilization": round(self.used / self.capacity, 6) if self.capacity else 0.0,
            # How much of the handed-out space callers asked for (internal fragmentation).
            "fill": round(self.requested / self.used, 6) if self.used else 1.0,
            "free_chunks": self.free_chunk_count,
            "chunks_returned": self.chunks_returned,
            "quarantined_chunks": len(self.quarantined),
            "quarantined_bytes": self.quarantined_bytes,
            "carved_idle_bytes": carved_idle,
            "classes": {str(c): {"chunks": n, "free_blocks": free_blocks[c]} for c, n in self._carved.items() if n},
            "interleave": {
                "ways": self.ways,
                "granularity": self.granularity,
                "zone_size": self.zone_size,
                "zone_bytes": self.zone_bytes(),
                "unused_bytes": self.unused_bytes,
            },
        }


class FitPlanner:
    """Would `nbytes` allocate once these blocks were freed? Tracks only what the candidates change:
    per chunk, how many of its blocks they free (a chunk is free again when all of them are)."""

    def __init__(self, alloc: Allocator, nbytes: int) -> None:
        self.a = alloc
        self.whole, self.cls = alloc.shape(nbytes)
        self.free_chunks = alloc.free_chunk_count
        # Chunks of the tail's class with a free block that stay carved: the tail fits one of
        # them without a chunk of its own.
        self.spots = sum(len(z) for z in alloc._partial[self.cls]) if self.cls else 0
        self._freed: dict[int, int] = {}  # chunk number -> candidate blocks freed in it

    def fits(self) -> bool:
        need = self.whole + (1 if self.cls and not self.spots else 0)
        return self.free_chunks >= need

    def add(self, blocks: Iterable[Block]) -> bool:
        """Count one candidate's blocks as freed; True once the request would fit."""
        a = self.a
        quarantined = a.quarantined
        for size, off in blocks:
            if quarantined and a._chunk_of(off) in quarantined:
                continue  # never comes back
            if size == CHUNK:
                self.free_chunks += 1
                continue
            chunk = a._chunk_of(off)
            key = chunk >> CHUNK_SHIFT
            n = self._freed.get(key, 0) + 1
            self._freed[key] = n
            already = len(a._partial[size][a.zone_of(chunk)].get(key, ()))
            if size == self.cls and n == 1 and not already:
                self.spots += 1  # a full chunk gets a free block
            if n + already == CHUNK // size:
                self.free_chunks += 1  # all its blocks free: it goes back to the free chunks
                if size == self.cls:
                    self.spots -= 1
        return self.fits()


def _upgrade(block: Block, base: int) -> Block:
    size, off = block
    if CHUNK // 2 < size < CHUNK and (off - base) % CHUNK == 0:
        return (CHUNK, off)
    return block


def _coalesce(blocks: list[Block], nbytes: int, *, in_order: bool = False) -> list[Extent]:
    """Extents covering exactly `nbytes`, merging blocks that sit back to back.

    Without interleave the blocks are taken lowest offset first (the most merging). With it they
    are taken in the order given, the order `alloc` placed them: the block's bytes then run through
    the zones one granule at a time, so even a partial read of a block (one layer's pieces) is
    spread over the devices. Sorting would put all of zone 0's granules first. The journal keeps
    the blocks in this order, so a restart rebuilds the same extents."""
    if len(blocks) == 1:  # most blocks: what the loop below gives for one, without it
        size, off = blocks[0]
        return [(off, size if size < nbytes else nbytes)]
    extents: list[list[int]] = []
    remaining = nbytes
    for size, off in blocks if in_order else sorted(blocks, key=lambda b: b[1]):
        take = min(size, remaining)
        remaining -= take
        if extents and extents[-1][0] + extents[-1][1] == off and extents[-1][1] % MIN_BLOCK == 0:
            extents[-1][1] += take
        else:
            extents.append([off, take])
    return [(o, n) for o, n in extents]
