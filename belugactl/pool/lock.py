"""Locks on the pool device or file: who may write the header's claim word, who may serve the pool.

Both are flock(2) locks on the pool path, so they hold between processes on this host only.
Hosts on a CXL 2.0 switch share no lock: across hosts the claim protocol (compare-and-swap, a
settle delay, a re-read: `workflows/setup/steps_header.py`) and the epoch fence the writers.

- `exclusive(path)`: blocks until no other process on this host holds the pool; it makes a
  compare-and-swap of the claim word atomic on this host even without the native helper.
- `ServerLock.acquire(path)`: one metadata server per pool per host; it never waits, because a
  second server would bump the epoch under the first and fence its clients.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from belugactl.errors import EnvironmentProblem


@contextlib.contextmanager
def exclusive(path: str | os.PathLike[str]) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


class ServerLock:
    """Held while a metadata server serves the pool; `release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: str | os.PathLike[str]) -> ServerLock:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise EnvironmentProblem(
                f"another metadata server is serving {path}",
                why="it holds the pool's lock; two servers would fence each other's clients",
                fix="stop the other one (`belugactl stop`, or SIGTERM it) before starting this one",
            ) from None
        return cls(Path(path), fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
