"""One rule for every path a command writes to: a file, a directory, or `-` for stdout.

- A file: its directory must already exist (nothing is created on the way) and, if the path exists,
  it must be a regular file (a link to one is followed). Directories, devices, FIFOs and sockets are
  refused, /dev/null included: a command that can print to stdout takes `-`, and `-o - >/dev/null`
  discards the output. (Writing "to" a device would replace it, or write beside it, as root.)
- A directory, where a command writes several files: it must already exist.
- A path ending in `/` always names a directory, never a file.

Anything else is a UsageError (exit 2) raised before a byte is written.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from belugactl.errors import EnvironmentProblem, UsageError

STDOUT = "-"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _existing_parent(path: Path, option: str) -> None:
    parent = path.parent
    if not parent.is_dir():
        missing = "does not exist" if not parent.exists() else "is not a directory"
        raise UsageError(
            f"{option} {path}: the directory {parent} {missing}",
            why="belugactl writes only into a directory that already exists; it creates none on the way",
            fix=f"create it first (mkdir -p {parent}) or choose another path",
        )


def output_file(value: str, *, option: str, stdout_ok: bool = True, suffixes: tuple[str, ...] = ()) -> Path | None:
    """The file `value` names, checked; None for `-` (stdout) where the command can print instead."""
    stdout_fix = f"pass `{option} -` to print it, and redirect stdout" if stdout_ok else "give a file path"
    if value == STDOUT:
        if stdout_ok:
            return None
        raise UsageError(f"{option} -: this option writes a file, not stdout", fix="give a file path")
    if value.endswith("/"):
        raise UsageError(
            f"{option} {value}: names a directory, but this option writes one file",
            fix=f"give a file path, e.g. {value}{'name' + suffixes[0] if suffixes else 'NAME'}",
        )
    path = Path(value)
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise UsageError(
                f"{option} {value}: a link to a missing file", fix="remove the link or give another path"
            ) from None
        st = None
    except OSError as exc:
        raise UsageError(f"{option} {value}: {exc.strerror or exc}", fix="give a writable file path") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{option} {value}: is {_kind(st.st_mode)}, not a file",
            why="this option writes one regular file",
            fix=f"give a file path inside it, e.g. {path / 'NAME'}" if stat.S_ISDIR(st.st_mode) else stdout_fix,
        )
    if suffixes and not path.name.endswith(suffixes):
        raise UsageError(
            f"{option} {value}: the file name must end in {' or '.join(suffixes)}",
            fix=f"e.g. {option} {path.with_name(path.name + suffixes[0])}",
        )
    _existing_parent(path, option)
    return path


def output_dir(value: str, *, option: str) -> Path:
    """An existing directory, for a command that writes several files into it."""
    path = Path(value)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise UsageError(
            f"{option} {value}: the directory {what}",
            why="belugactl writes several files into an existing directory; it creates none",
            fix=f"create it first (mkdir -p {value.rstrip('/') or '/'}) or choose another directory",
        )
    return path


def new_directory(value: str, *, option: str) -> Path:
    """A directory to create (its parent exists) or an existing empty one, to fill with a tree of files."""
    path = Path(value)
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{option} {value}: a link to nothing", fix="remove the link or give another path")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISDIR(mode):
            raise UsageError(
                f"{option} {value}: is {_kind(mode)}, not a directory",
                fix="give a new directory name, or a FILE.tar.gz",
            )
        if any(path.iterdir()):
            raise UsageError(f"{option} {value}: the directory is not empty", fix="give a new or empty directory")
        return path
    _existing_parent(path, option)
    return path


def write_output(path: Path | None, text: str) -> None:
    """Write `text` to the checked `path`, or to stdout for None; a failing write is the environment's (exit 3)."""
    if path is None:
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot write {path}", why=exc.strerror or str(exc), fix="choose a writable path"
        ) from None


def is_dir_path(value: str) -> bool:
    """Whether `value` names a directory: a trailing `/`, or an existing directory."""
    return value.endswith("/") or os.path.isdir(value)
