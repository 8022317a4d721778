"""The counting build of the native helper, for tests that prove the pool's bytes are made visible.

`_native_counting` is `_native` compiled again with -DBELUGA_COUNT_FLUSHES (setup.py): every flush,
non-temporal store and fence, and each pool copy's read and written ranges, append a record
(_native_count.c). `counting()` swaps it in for `_native` wherever a loaded belugactl module holds
the normal module or one of its functions (native.py's names, the ring's cached entry points), so
the real data-plane code runs on it; `Recording` answers the two questions the tests ask:
was every written line written back (or streamed) and then fenced, and was every read line
invalidated before it was read.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

LINE = 64
WB, INV, NT, FENCE, READ, WRITE = 1, 2, 3, 4, 5, 6
KIND_NAMES = {WB: "write-back", INV: "invalidate", NT: "non-temporal", FENCE: "fence", READ: "read", WRITE: "write"}
MISSING = (
    "the counting build belugactl.dataplane._native_counting is not built"
    " (.venv/bin/python setup.py build_ext --inplace)"
)


def load() -> ModuleType | None:
    """The counting module, or None where it is not built."""
    try:
        from belugactl.dataplane import _native_counting  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native_counting


@dataclass(frozen=True)
class Record:
    kind: int
    offset: int
    length: int
    repeats: int

    def lines(self) -> range:
        if self.kind == FENCE or self.length == 0:
            return range(0)
        return range(self.offset // LINE, (self.offset + self.length + LINE - 1) // LINE)


def as_ranges(lines: Iterable[int]) -> list[tuple[int, int]]:
    """Line numbers as byte ranges [start, end), merged."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(lines)):
        if out and out[-1][1] == n * LINE:
            out[-1] = (out[-1][0], (n + 1) * LINE)
        else:
            out.append((n * LINE, (n + 1) * LINE))
    return out


class Recording:
    """The records that met one buffer, in the order they were made (offsets relative to it)."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    def lines(self, kind: int) -> set[int]:
        return {n for r in self.records if r.kind == kind for n in r.lines()}

    def summary(self) -> dict[str, int]:
        """Per operation: lines written back, lines invalidated, non-temporal bytes, fences."""
        return {
            "lines_written_back": len(self.lines(WB)),
            "lines_invalidated": len(self.lines(INV)),
            "nontemporal_bytes": sum(r.length for r in self.records if r.kind == NT),
            "fences": sum(r.repeats for r in self.records if r.kind == FENCE),
        }

    def unpublished(self, offset: int, n: int) -> list[tuple[int, int]]:
        """Ranges of [offset, offset+n) NOT made visible: a line needs a write-back or non-temporal
        store after the last plain write of it that was recorded, and a fence after that."""
        bad: list[int] = []
        for line in range(offset // LINE, (offset + n + LINE - 1) // LINE):
            visible = -1  # the first write-back or stream of the line after its last recorded write
            for i, r in enumerate(self.records):
                if line in r.lines():
                    if r.kind == WRITE:
                        visible = -1
                    elif r.kind in (WB, NT) and visible < 0:
                        visible = i
            ok = visible >= 0 and any(r.kind == FENCE for r in self.records[visible + 1 :])
            if not ok:
                bad.append(line)
        return as_ranges(bad)

    def read_stale(self, offset: int, n: int) -> list[tuple[int, int]]:
        """Ranges of [offset, offset+n) read without an invalidation first: a line needs an
        invalidate record before the first recorded read of it (or anywhere, where the read was
        made by C code that records no reads: the ring's own loads)."""
        bad: list[int] = []
        for line in range(offset // LINE, (offset + n + LINE - 1) // LINE):
            first_read = len(self.records)
            for i, r in enumerate(self.records):
                if r.kind == READ and line in r.lines():
                    first_read = i
                    break
            if not any(r.kind == INV and line in r.lines() for r in self.records[:first_read]):
                bad.append(line)
        return as_ranges(bad)


class Counter:
    """The swapped-in counting module: reset, then read what one buffer got."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def reset(self) -> None:
        self.module.count_reset()

    def recording(self, buf: Any) -> Recording:
        if self.module.count_lost():
            raise RuntimeError(f"the counting build dropped {self.module.count_lost()} records (buffer full)")
        return Recording([Record(*t) for t in self.module.count_records(buf)])


def _swap_targets(normal: ModuleType) -> Iterator[tuple[Any, str, Any]]:
    """(holder, name, value) for every module or class attribute holding `normal` or one of its functions."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name.startswith("belugactl") or name.startswith("vllm_beluga")):
            continue
        holders: list[Any] = [mod]
        holders += [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == name]
        for holder in holders:
            for attr, value in list(vars(holder).items()):
                if value is normal or getattr(value, "__self__", None) is normal:
                    yield holder, attr, value


@contextmanager
def counting() -> Iterator[Counter]:
    """Run the data plane on the counting build inside the block; the normal module comes back after."""
    counter_mod = load()
    if counter_mod is None:
        raise RuntimeError(MISSING)
    from belugactl.dataplane import native

    normal = native._native
    if normal is None:
        raise RuntimeError("the native helper is not loaded (BELUGACTL_NATIVE=0, or not built)")
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for holder, attr, value in list(_swap_targets(normal)):
            new = counter_mod if value is normal else getattr(counter_mod, value.__name__)
            setattr(holder, attr, new)
            swapped.append((holder, attr, value))
        counter_mod.count_reset()
        yield Counter(counter_mod)
    finally:
        for holder, attr, value in swapped:
            setattr(holder, attr, value)
