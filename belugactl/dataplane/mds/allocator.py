"""Segregated-fit allocator over the shared KV area.

The area is cut into 2 MiB chunks (the devdax alignment). A request of up to one chunk gets one
block of the smallest size class that holds it; classes are 4 KiB-aligned sizes in steps of
2^k and 1.5 * 2^k, so a block wastes at most a third of itself. Each class keeps a free list
(a Python list used as a stack: O(1) alloc and free); an empty class takes a whole chunk from
the chunk free list and carves it. Larger requests take whole chunks for the bulk and one class
block for the tail, coalescing adjacent chunks so a mostly-empty pool answers with one extent.

Chunks carved for a class stay with that class (no O(n) return path); KV blocks of one model
have one size, so churn settles on one or two classes. `stats()` reports how much carved space
sits idle in other classes so an operator can see that cost.
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK = 2 << 20
MIN_BLOCK = 4 << 10


def _size_classes() -> list[int]:
    sizes: set[int] = set()
    s = MIN_BLOCK
    # Classes stop below a chunk: a request of more than 1.5 MiB takes a whole chunk.
    while s < CHUNK:
        sizes.add(s)
        mid = s + s // 2
        if mid < CHUNK and mid % MIN_BLOCK == 0:
            sizes.add(mid)
        s *= 2
    return sorted(sizes)


SIZE_CLASSES: tuple[int, ...] = tuple(_size_classes())

Extent = tuple[int, int]


@dataclass
class Allocation:
    """What one reservation holds: the extents handed out, and the blocks to give back."""

    extents: list[Extent]
    blocks: list[tuple[int, int]]  # (class size or CHUNK for a whole chunk, offset)
    nbytes: int

    @property
    def footprint(self) -> int:
        return sum(size for size, _ in self.blocks)


class Allocator:
    def __init__(self, base: int, size: int) -> None:
        if base % CHUNK:
            raise ValueError(f"shared KV area offset {base:#x} is not 2 MiB aligned")
        self.base = base
        self.chunks = size // CHUNK
        self.capacity = self.chunks * CHUNK
        # Chunks given back (a stack), and a bump pointer over chunks never handed out: an 8 TiB
        # area has 4 million chunks, too many to list up front. Fresh chunks come in address
        # order, so a mostly-empty area coalesces large blocks into one extent.
        self._free_chunks: list[int] = []
        self._fresh = base
        self._end = base + self.chunks * CHUNK
        self._free: dict[int, list[int]] = {c: [] for c in SIZE_CLASSES}
        self._carved: dict[int, int] = dict.fromkeys(SIZE_CLASSES, 0)  # chunks per class
        self.used = 0  # bytes in blocks handed out (footprint)
        self.requested = 0  # bytes callers asked for

    @staticmethod
    def class_for(nbytes: int) -> int:
        # Linear over ~20 sizes is cheaper than bisect's call overhead here and stays O(1).
        for c in SIZE_CLASSES:
            if c >= nbytes:
                return c
        raise ValueError(f"{nbytes} bytes is above the largest size class")

    @property
    def free_chunk_count(self) -> int:
        return len(self._free_chunks) + (self._end - self._fresh) // CHUNK

    def _pop_chunk(self) -> int | None:
        if self._free_chunks:
            return self._free_chunks.pop()
        if self._fresh < self._end:
            chunk = self._fresh
            self._fresh += CHUNK
            return chunk
        return None

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    def _take_block(self, cls: int) -> int | None:
        free = self._free[cls]
        if not free:
            chunk = self._pop_chunk()
            if chunk is None:
                return None
            self._carved[cls] += 1
            count = CHUNK // cls
            # Highest first so pop() yields ascending offsets.
            free.extend(chunk + i * cls for i in range(count - 1, -1, -1))
        return free.pop()

    def alloc(self, nbytes: int) -> Allocation | None:
        """Blocks for `nbytes`, or None (nothing taken) when the area cannot hold them."""
        if nbytes <= 0:
            raise ValueError("allocation size must be positive")
        whole, tail = divmod(nbytes, CHUNK)
        if tail > SIZE_CLASSES[-1]:
            whole, tail = whole + 1, 0
        blocks: list[tuple[int, int]] = []
        if whole:
            if whole > self.free_chunk_count:
                return None
            blocks.extend((CHUNK, self._pop_chunk()) for _ in range(whole))  # type: ignore[misc]
        if tail:
            cls = self.class_for(tail)
            off = self._take_block(cls)
            if off is None:
                self._give_back(blocks)
                return None
            blocks.append((cls, off))
        footprint = sum(s for s, _ in blocks)
        self.used += footprint
        self.requested += nbytes
        return Allocation(_coalesce(blocks, nbytes), blocks, nbytes)

    def free(self, allocation: Allocation) -> None:
        self._give_back(allocation.blocks)
        self.used -= allocation.footprint
        self.requested -= allocation.nbytes

    def _give_back(self, blocks: list[tuple[int, int]]) -> None:
        for size, off in blocks:
            if size == CHUNK:
                self._free_chunks.append(off)
            else:
                self._free[size].append(off)

    def restore(self, allocations: list[tuple[int, list[tuple[int, int]]]]) -> list[Allocation]:
        """Rebuild a fresh allocator's state from the live blocks of a journal: (nbytes, blocks) each.

        Raises ValueError (nothing changed) when the blocks are inconsistent: outside the area,
        misaligned, overlapping, or two classes in one chunk.
        """
        if self.used:
            raise ValueError("restore needs an empty allocator")
        chunk_class: dict[int, int] = {}  # chunk offset -> class size, or CHUNK for a whole chunk
        taken: set[int] = set()
        end = self.base + self.capacity
        classes = set(SIZE_CLASSES)
        for _nbytes, blocks in allocations:
            for size, off in blocks:
                chunk = off - (off - self.base) % CHUNK
                if not self.base <= off < end or (size != CHUNK and size not in classes) or off in taken:
                    raise ValueError(f"block ({size}, {off:#x}) is outside the area, unknown or duplicated")
                if (off - chunk) % size or off - chunk + size > CHUNK:
                    raise ValueError(f"block ({size}, {off:#x}) is not aligned to its class")
                if chunk_class.setdefault(chunk, size) != size or (size == CHUNK and off != chunk):
                    raise ValueError(f"chunk {chunk:#x} holds blocks of two sizes")
                taken.add(off)
        top = max(chunk_class, default=self.base - CHUNK) + CHUNK  # chunks above the highest used stay fresh
        self._fresh = top
        self._free_chunks = [c for c in range(top - CHUNK, self.base - 1, -CHUNK) if c not in chunk_class]
        for chunk, size in chunk_class.items():
            if size == CHUNK:
                continue
            self._carved[size] += 1
            count = CHUNK // size
            self._free[size].extend(
                o for o in (chunk + i * size for i in range(count - 1, -1, -1)) if o not in taken
            )
        restored = []
        for nbytes, blocks in allocations:
            a = Allocation(_coalesce(list(blocks), nbytes), list(blocks), nbytes)
            self.used += a.footprint
            self.requested += nbytes
            restored.append(a)
        return restored

    def stats(self) -> dict[str, object]:
        carved_idle = sum(len(v) * c for c, v in self._free.items())
        return {
            "capacity": self.capacity,
            "used": self.used,
            "requested": self.requested,
            "free": self.capacity - self.used,
            "utilization": round(self.used / self.capacity, 6) if self.capacity else 0.0,
            # How much of the handed-out space callers asked for (internal fragmentation).
            "fill": round(self.requested / self.used, 6) if self.used else 1.0,
            "free_chunks": self.free_chunk_count,
            "carved_idle_bytes": carved_idle,
            "classes": {str(c): {"chunks": n, "free_blocks": len(self._free[c])} for c, n in self._carved.items() if n},
        }


def _coalesce(blocks: list[tuple[int, int]], nbytes: int) -> list[Extent]:
    """Extents covering exactly `nbytes`, merging blocks that sit back to back."""
    extents: list[list[int]] = []
    remaining = nbytes
    for size, off in sorted(blocks, key=lambda b: b[1]):
        take = min(size, remaining)
        remaining -= take
        if extents and extents[-1][0] + extents[-1][1] == off and extents[-1][1] % MIN_BLOCK == 0:
            extents[-1][1] += take
        else:
            extents.append([off, take])
    return [(o, n) for o, n in extents]
