"""The first bytes of the pool, mapped shared: where the header and its claim word live.

A device-dax node only supports mmap (no read/write syscalls), with lengths that are multiples of
its alignment, so everything goes through one shared mapping of the header area. The same code
maps a plain file (development, tests, the fixture trees).

Compare-and-swap of the claim word: two processes on one machine are serialised with flock on the
pool file, which makes the CAS atomic there. Given `atomics` (the data plane's native helper: a
locked cmpxchg, cache-line flush and fence), the swap itself is a hardware CAS and every write is
flushed out of this host's caches and every read refetched, so another host can see it. Hosts on
a CXL 2.0 switch still share no coherence and no lock; the claim protocol in
`workflows/setup/steps_header.py` adds a settle delay and a re-read, which turns a race into a
detectable conflict rather than two silent writers.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host


class PoolWindow:
    def __init__(self, fd: int, mapping: mmap.mmap, length: int, device: str, atomics: Any = None) -> None:
        self._fd = fd
        self._map = mapping
        self.length = length
        self.device = device
        self._atomics = atomics  # cas64/load64/flush/fence over a buffer, or None

    @classmethod
    def open(
        cls, host: Host, device: str, length: int, *, writable: bool = True, atomics: Any = None
    ) -> PoolWindow:
        path = host.path(device)
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except FileNotFoundError as exc:
            raise StepFailed(f"{device} does not exist", fix="run `belugactl setup` first") from exc
        except PermissionError as exc:
            raise EnvironmentProblem(
                f"cannot open {device}", why=str(exc), fix="run as root or as the pool's owner group"
            ) from exc
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mapping = mmap.mmap(fd, length, mmap.MAP_SHARED, prot)
        except (OSError, ValueError) as exc:
            os.close(fd)
            raise StepFailed(
                f"cannot map the first {length} bytes of {device}",
                why=str(exc),
                fix="the device must be at least this large and its align must divide the length",
            ) from exc
        return cls(fd, mapping, length, device, atomics if writable else None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._map.close()
        os.close(self._fd)

    def __enter__(self) -> PoolWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.length:
            raise ValueError(f"range {offset}+{size} outside the mapped {self.length} bytes")

    def read(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        if self._atomics is not None:
            self._atomics.flush(self._map, offset, size, True)  # drop stale lines: another host may have written
        return bytes(self._map[offset : offset + size])

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        self._map[offset : offset + len(data)] = data
        self.flush(offset, len(data))

    def flush(self, offset: int = 0, size: int = 0) -> None:
        if self._atomics is not None and size:
            self._atomics.flush(self._map, offset, size)
            self._atomics.fence()
        # msync: reaches the file for file-backed pools; device-dax mappings are the media itself.
        with contextlib.suppress(OSError):
            self._map.flush()

    def load_u64(self, offset: int) -> int:
        if self._atomics is not None:
            self._atomics.flush(self._map, offset, 8, True)
            return int(self._atomics.load64(self._map, offset))
        return struct.unpack_from("<Q", self._map, offset)[0]

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def cas_u64(self, offset: int, expected: int, new: int) -> int:
        """Store `new` if the word holds `expected`; return the value found (== expected on success)."""
        if offset % 8:
            raise ValueError("the claim word must be 8-byte aligned")
        self._check(offset, 8)
        with self._exclusive():
            if self._atomics is not None:
                self._atomics.flush(self._map, offset, 8, True)
                found = int(self._atomics.cas64(self._map, offset, expected, new))
            else:
                found = self.load_u64(offset)
                if found == expected:
                    struct.pack_into("<Q", self._map, offset, new)
            self.flush(offset, 8)
            return found
