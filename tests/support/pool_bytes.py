"""Reading a fake machine's pool file (a sparse file of hundreds of MiB) without reading all of it.

`head` reads the first bytes only; `fingerprint` stands for the whole content: two pool files of
the same size have equal fingerprints exactly when their bytes are equal (up to SHA-256 collisions),
and only the allocated extents are read (holes read as zeros, so an all-zero block is left out
whether it is a hole or written zeros).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

BLOCK = 1 << 20


def head(path: Path, length: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(length)


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    extents, offset = [], 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after offset
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, end))
        offset = end
    return extents


def fingerprint(path: Path) -> tuple[int, dict[int, str]]:
    """The file's size and, per aligned BLOCK that holds a non-zero byte, that block's SHA-256."""
    size = path.stat().st_size
    digests: dict[int, str] = {}
    zero = bytes(BLOCK)
    with open(path, "rb") as fh:
        blocks = sorted({b for start, end in _data_extents(fh.fileno(), size)
                         for b in range(start // BLOCK, (end + BLOCK - 1) // BLOCK)})  # fmt: skip
        for index in blocks:
            fh.seek(index * BLOCK)
            data = fh.read(BLOCK)
            if data != zero[: len(data)]:
                digests[index] = hashlib.sha256(data).hexdigest()
    return size, digests
