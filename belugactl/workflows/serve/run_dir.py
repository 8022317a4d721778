"""The run dir: where serve keeps its state file and logs, and why `stop` may believe them.

`stop` signals the processes a state file names, so neither the file nor the directory may be
anyone else's to write. Serve (often root, from a boot unit) creates files in the run dir, so a
directory another user can write is a place to plant symlinks. The rules, for serve and stop alike:

- the run dir, and its `logs/` and `stats/`, are directories (not symlinks) owned by this user and
  not writable by group or others; every directory above it is owned by this user or root and is
  not group/other-writable unless sticky (/tmp), so nobody can swap the run dir for another;
- the state file is a regular file with the same owner and mode rules;
- serve creates its files without following a symlink (O_NOFOLLOW) and, for files it replaces,
  as new files (O_EXCL) renamed into place; logs are appended to without following a symlink.

A state file proves little on its own: its identities (pid, start time, command line) can be copied
from /proc. What a process serve did not start cannot show is a file of this run dir held open:
each child's stdout is its log, and the supervisor holds `supervisor.lock` open while it runs.
`holds_file` checks that through /proc/PID/fd before `stop` signals anything.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO

from belugactl.errors import InputError

SUPERVISOR_MARK = "supervisor.lock"
PRIVATE_DIRS = ("logs", "stats")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _user(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refuse(what: str, why: str, fix: str) -> InputError:
    return InputError(what, why=why, fix=fix)


def check_private_dir(path: Path, *, euid: int | None = None) -> None:
    """Refuse (exit 2) a run dir that someone other than this user could write, or swap."""
    me = os.geteuid() if euid is None else euid
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _refuse(
            f"run dir {path} does not exist", "serve has not run here", "pass the --run-dir serve used"
        ) from None
    fix = f"use a run dir of your own (mkdir -m 700 DIR), or: chown {_user(me).split(' ')[0]} {path}; chmod go-w {path}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(
            f"run dir {path} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a directory'}",
            "serve writes its state and logs there and `stop` signals what the state names: it must be a real "
            "directory of this user's",
            f"pass the directory it points to, or another run dir ({path} is left alone)",
        )
    if st.st_uid != me:
        raise _refuse(
            f"run dir {path} belongs to {_user(st.st_uid)}, not to {_user(me)}",
            "its owner could plant symlinks that serve would write through, or a state file that `stop` would obey",
            fix,
        )
    if st.st_mode & 0o022:
        raise _refuse(
            f"run dir {path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})",
            "another user could plant symlinks that serve would write through, or a state file that `stop` would obey",
            fix,
        )
    for parent in Path(os.path.realpath(path.parent)).joinpath("x").parents:
        pst = os.stat(parent)
        if pst.st_uid not in (me, 0) or (pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX):
            raise _refuse(
                f"run dir {path}: {parent} above it can be changed by {_user(pst.st_uid)} or its group/others "
                f"(mode {stat.S_IMODE(pst.st_mode):04o})",
                "whoever can write a directory above the run dir can replace the run dir with one of theirs",
                "use a run dir under a directory only you and root can write (the default is one)",
            )


def prepare_run_dir(path: str | Path) -> Path:
    """Create the run dir (mode 0700) and its private subdirectories if missing, then check them all."""
    run = Path(path)
    # Every directory serve creates is 0700 (whatever the umask): a group-writable parent would be
    # refused below, and a umask of 002 is common.
    for missing in reversed([p for p in (run, *run.parents) if not os.path.lexists(p)]):
        with contextlib.suppress(FileExistsError):
            os.mkdir(missing, 0o700)
    check_private_dir(run)
    for name in PRIVATE_DIRS:
        sub = run / name
        if not os.path.lexists(sub):
            with contextlib.suppress(FileExistsError):
                os.mkdir(sub, 0o700)
        check_private_dir(sub)
    return run


def check_state_file(path: Path, *, euid: int | None = None) -> None:
    """Refuse (exit 2) a state file, or a run dir, that anyone but this user could have written."""
    me = os.geteuid() if euid is None else euid
    check_private_dir(path.parent, euid=me)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
        kind = (
            "a symlink" if stat.S_ISLNK(st.st_mode) else ("not a regular file" if not stat.S_ISREG(st.st_mode) else "")
        )
        owner = "" if st.st_uid == me else f"owned by {_user(st.st_uid)}"
        mode = f"mode {stat.S_IMODE(st.st_mode):04o}" if st.st_mode & 0o022 else ""
        raise _refuse(
            f"state file {path} is {', '.join(x for x in (kind, owner, mode) if x)}",
            "`stop` signals the processes a state file names: only a file serve wrote as this user is believed",
            f"check what runs with `ps`, stop it yourself, and remove {path}",
        )


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (mode 0600): written to a new file, never through a planted symlink."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # unlink removes a symlink itself, never its target
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def open_log(path: Path) -> IO[bytes]:
    """Open a log for appending, never through a symlink, and only a regular file of this user's."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
    except OSError as exc:
        raise _refuse(
            f"cannot open the log {path}: {exc.strerror}",
            "serve opens its logs without following symlinks (a symlink there was planted, or left behind)",
            f"remove {path} and start again",
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise _refuse(
            f"the log {path} is not a regular file of this user's",
            "serve appends only to its own logs",
            f"remove {path} and start again",
        )
    return os.fdopen(fd, "ab")


def hold_mark(run: Path) -> int:
    """Open (creating) the supervisor's mark and return the fd, held for the supervisor's lifetime."""
    return os.open(run / SUPERVISOR_MARK, os.O_RDONLY | os.O_CREAT | _NOFOLLOW, 0o600)


def holds_file(pid: int, path: Path, fds: tuple[int, ...] | None = None) -> bool | None:
    """Whether process `pid` has `path` open (among `fds`, else any fd): compared by device and inode.

    None when that cannot be told (the file is gone, or /proc/PID/fd is not readable by this user)."""
    try:
        want = os.stat(path, follow_symlinks=False)
        names = [str(fd) for fd in fds] if fds is not None else os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in names:
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False
