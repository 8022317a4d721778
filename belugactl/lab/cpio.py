"""A writer for the `newc` cpio format the kernel unpacks as an initramfs.

Written here rather than driving the `cpio` tool because the archive needs a /dev/console device
node, which an unprivileged user cannot create on disk but can describe in an archive.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import BinaryIO

_MAGIC = b"070701"


@dataclass(frozen=True)
class Entry:
    name: str  # relative path inside the archive, no leading slash
    mode: int  # full st_mode: type bits and permissions
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def directory(name: str, perm: int = 0o755) -> Entry:
    return Entry(name, stat.S_IFDIR | perm)


def file(name: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(name, stat.S_IFREG | perm, data)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def char_device(name: str, major: int, minor: int, perm: int = 0o600) -> Entry:
    return Entry(name, stat.S_IFCHR | perm, rdev=(major, minor))


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def _header(ino: int, entry: Entry, namesize: int) -> bytes:
    fields = (
        ino,
        entry.mode,
        0,  # uid: root inside the guest
        0,  # gid
        2 if stat.S_ISDIR(entry.mode) else 1,
        0,  # mtime: fixed, so the same inputs give the same bytes
        len(entry.data),
        0,
        0,
        entry.rdev[0],
        entry.rdev[1],
        namesize,
        0,
    )
    return _MAGIC + b"".join(b"%08X" % f for f in fields)


def write(out: BinaryIO, entries: list[Entry]) -> None:
    for ino, entry in enumerate([*entries, Entry("TRAILER!!!", 0)], start=1):
        name = entry.name.lstrip("/").encode() + b"\0"
        head = _header(ino if entry.mode else 0, entry, len(name))
        out.write(head + name + _pad(len(head) + len(name)))
        out.write(entry.data + _pad(len(entry.data)))


def read(data: bytes) -> list[Entry]:
    """Parse a newc archive (for tests and `lab status` sanity checks)."""
    entries: list[Entry] = []
    pos = 0
    while True:
        if data[pos : pos + 6] != _MAGIC:
            raise ValueError(f"bad cpio magic at offset {pos}")
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, rmaj, rmin, namesize = fields[1], fields[6], fields[9], fields[10], fields[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos += namesize + len(_pad(110 + namesize))
        body = data[pos : pos + filesize]
        pos += filesize + len(_pad(filesize))
        if name == "TRAILER!!!":
            return entries
        entries.append(Entry(name, mode, body, (rmaj, rmin)))
