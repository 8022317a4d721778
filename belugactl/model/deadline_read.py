"""Read an input file with a size bound and, where it can block, a deadline.

A regular file is read as usual. Anything else (a FIFO, `/dev/stdin` on a pipe or a terminal, a
character device) is read with poll(): a FIFO nobody writes to, or a stdin that never closes, ends
in InputTimeout instead of a hang. BELUGACTL_INPUT_TIMEOUT sets the deadline in seconds.
"""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "BELUGACTL_INPUT_TIMEOUT"


class InputTimeout(Exception):
    """Nothing (or not everything) arrived before the deadline."""

    def __init__(self, kind: str, waited_s: float, got: int) -> None:
        super().__init__(f"{kind}: {got} bytes in {waited_s:g} s and no end of input")
        self.kind, self.waited_s, self.got = kind, waited_s, got


def input_timeout_s() -> float:
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO or pipe"
    if stat.S_ISCHR(mode):
        return "a terminal or character device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def read_bounded(path: Path, limit: int, *, timeout_s: float | None = None) -> bytes:
    """At most `limit` bytes of `path`; raises OSError as open() does, and InputTimeout past the deadline."""
    # O_NONBLOCK: opening a FIFO with no writer would otherwise block in open() itself.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read(limit)
        return _read_polled(fd, limit, _kind(mode), timeout_s if timeout_s is not None else input_timeout_s())
    finally:
        os.close(fd)


def _read_polled(fd: int, limit: int, kind: str, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(max(1, int(remaining * 1000))):
            raise InputTimeout(kind, timeout_s, got)
        try:
            data = os.read(fd, min(1 << 16, limit - got))
        except BlockingIOError:
            continue
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)
