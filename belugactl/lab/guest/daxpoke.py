"""Read or write a few bytes of a device-DAX character device (or any file) through mmap.

Run inside guests as `python3 -I -S daxpoke.py write|read DEVICE OFFSET [HEX|LENGTH]`, so it uses the
standard library only. Device DAX accepts no read()/write(), only mmap, and only of whole aligned
chunks: the mapping covers the 2 MiB-aligned chunk holding the bytes.
"""

from __future__ import annotations

import mmap
import os
import sys

CHUNK = 2 * 1024 * 1024


def _map(path: str, offset: int, length: int, writable: bool) -> tuple[mmap.mmap, int]:
    start = offset - offset % CHUNK
    size = ((offset + length - start + CHUNK - 1) // CHUNK) * CHUNK
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot, offset=start), offset - start
    finally:
        os.close(fd)


def write(path: str, offset: int, data: bytes) -> None:
    mapping, at = _map(path, offset, len(data), True)
    with mapping:
        mapping[at : at + len(data)] = data
        # msync() on device DAX fails with EINVAL: its stores need no write-back to reach the media.
        if os.path.isfile(path):
            mapping.flush()


def read(path: str, offset: int, length: int) -> bytes:
    mapping, at = _map(path, offset, length, False)
    with mapping:
        return bytes(mapping[at : at + length])


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("read", "write"):
        print("usage: daxpoke.py write DEVICE OFFSET HEX | read DEVICE OFFSET LENGTH", file=sys.stderr)
        return 2
    op, path, offset = argv[0], argv[1], int(argv[2], 0)
    if op == "write":
        write(path, offset, bytes.fromhex(argv[3]))
    else:
        print(read(path, offset, int(argv[3], 0)).hex())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
