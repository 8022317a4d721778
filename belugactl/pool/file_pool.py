"""A pool in a plain file: development, CI, benchmarks, and the lab's shared backing file.

The file is sparse and laid out exactly like a device: the manifest's pool size, with a valid
header at offset 0, so `PoolMapping.open` treats it like `/dev/daxX.Y` (minus the flushes).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from belugactl.errors import PoolMismatch, PoolMissing
from belugactl.pool.header import PoolHeader
from belugactl.pool.mapping import load_manifest_arg

if TYPE_CHECKING:
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Manifest


def free_bytes(directory: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on `directory`'s file system; None if it cannot be read."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def create_file_pool(
    path: str | os.PathLike[str],
    manifest: Manifest | str | os.PathLike[str],
    *,
    created_by: str | None = None,
    exist_ok: bool = False,
    layout: PoolLayout | None = None,
) -> Path:
    """Write a sparse file of the manifest's pool size with a valid header (development and CI).

    The file is created with O_CREAT|O_EXCL|O_NOFOLLOW: a symlink planted at the path (dangling or
    not) is refused, never followed, so nobody can aim the pool's bytes at a file of their choosing.
    Its mode is 0600 (every tenant's KV bytes live in it), or the manifest's `pool.permissions.mode`
    where the manifest sets one; the umask does not widen or narrow it.
    """
    from belugactl.model.layout import resolve_layout

    loaded = load_manifest_arg(manifest)
    assert loaded is not None
    layout = layout if layout is not None else resolve_layout(loaded)  # the caller's, when it has one
    header = PoolHeader.from_layout(loaded, layout, created_by=created_by or socket.gethostname()[:47] or "belugactl")
    target = Path(path)
    mode = loaded.pool.permissions.mode_bits if "permissions" in loaded.pool.model_fields_set else 0o600
    try:
        existing = os.lstat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISLNK(existing.st_mode):
        raise PoolMismatch(
            f"{target} is a symbolic link; refusing to create a pool through it",
            why="a link at a pool path would send every tenant's KV bytes wherever it points",
            fix="remove the link, or pass the real path of a file in a directory only you can write",
        )
    if existing is not None and not exist_ok:
        raise PoolMismatch(f"{target} exists already", fix="remove it or pass exist_ok=True to overwrite its header")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise PoolMismatch(f"{target} is not a regular file", fix="a file pool is a regular file; pass another path")
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (0 if existing is not None else os.O_CREAT | os.O_EXCL)
    try:
        fd = os.open(target, flags, mode)
    except FileExistsError:
        raise PoolMismatch(
            f"{target} appeared while the pool was being created (a file or a link put there by someone else)",
            fix="choose a path in a directory only you can write, e.g. your home directory",
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PoolMismatch(f"{target} is a symbolic link; refusing to follow it", fix="remove the link") from None
        raise PoolMissing(
            f"cannot create the pool file {target}: {exc.strerror or exc}", fix="choose a writable path"
        ) from None
    if existing is None:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
    with os.fdopen(fd, "r+b") as f:
        f.truncate(layout.pool_size)
        # Magic last, so a reader never sees a magic in front of a half-written record.
        f.write(header.pack(include_magic=False))
        f.flush()
        f.seek(0)
        f.write(header.pack()[:8])
        f.flush()
        os.fsync(f.fileno())
    return target
