"""Write a secret file (the rack secret): mode 0600 from its first byte, never through a link.

Setup's `secret` topic decides; this only writes. A new file is created with O_EXCL and renamed
over the old one only when asked (`replace`), so a half-written secret is never read.
"""

from __future__ import annotations

import contextlib
import os

from belugactl.errors import EnvironmentProblem
from belugactl.host.host import Host
from belugactl.host.write_udev import lookup_uid


def write_secret(host: Host, path: str, text: str, owner: str | None, *, replace: bool) -> None:
    """Create `path` with `text`, mode 0600, owned by `owner` (when running as root; None: as is)."""
    target = host.path(path)
    uid = _uid(host, owner)
    tmp = target.with_name(f".{target.name}.belugactl-tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # left by a crash: never ours to keep
        fd = os.open(tmp if replace else target, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if uid is not None:
                os.fchown(fd, uid, -1)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, target)
    except FileExistsError as exc:
        raise EnvironmentProblem(
            f"{path} appeared while setup was writing it", fix="run setup again: it looks at the file first"
        ) from exc
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot write {path}: permission denied", fix="run as root") from exc


def secure_secret(host: Host, path: str, owner: str | None) -> None:
    """chmod 0600 (and chown to `owner` as root) of an existing secret file, not following a link."""
    target = host.path(path)
    uid = _uid(host, owner)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot open {path}: permission denied", fix="run as root") from exc
    try:
        os.fchmod(fd, 0o600)
        if uid is not None:
            os.fchown(fd, uid, -1)
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot chmod/chown {path}: permission denied", fix="run as root") from exc
    finally:
        os.close(fd)


def _uid(host: Host, owner: str | None) -> int | None:
    if owner is None or os.geteuid() != 0:
        return None  # not root: the file is this user's, as the server that reads it will be
    uid = int(owner) if owner.isdigit() else lookup_uid(host, owner)
    if uid is None:
        raise EnvironmentProblem(
            f"no user named {owner!r} on this host (the pool's owner, who runs the metadata server)",
            fix=f"create it first (`useradd {owner}`), or change pool.permissions.owner in the manifest",
        )
    return uid
