"""What setup made on this host (state file) and the lock that keeps two setups apart.

The state file (`/var/lib/belugactl/state.json` under the Host root) is how teardown removes only
what setup made: the MTRR registers it added, the region and namespace it created, the settings
it changed and their values before. The lock (`/run/belugactl/setup.lock`, fcntl) is released by
the kernel when the process dies, so a crashed setup never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from typing import Any

from belugactl.errors import BelugaError, EnvironmentProblem, InputError
from belugactl.host.host import Host

STATE_FILE = "/var/lib/belugactl/state.json"
LOCK_FILE = "/run/belugactl/setup.lock"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
STATE_VERSION = 1


class SetupLocked(BelugaError):
    """Another setup or teardown holds the lock on this host."""


def empty_state() -> dict[str, Any]:
    return {"version": STATE_VERSION, "created": {}, "previous": {}, "mtrr": [], "boot_id": None}


def load_state(host: Host) -> dict[str, Any]:
    text = host.read_text(STATE_FILE)
    if text is None:
        return empty_state()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{STATE_FILE} is not valid JSON",
            why=str(exc),
            fix="inspect it; if setup never ran to completion, move it aside and run setup again",
            where=str(host.path(STATE_FILE)),
        ) from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise InputError(
            f"{STATE_FILE} has an unknown format (version {data.get('version') if isinstance(data, dict) else '?'})",
            fix="it was written by another belugactl version; move it aside and run setup again",
        )
    state = empty_state()
    state.update(data)
    return state


def save_state(host: Host, state: dict[str, Any]) -> None:
    target = host.path(STATE_FILE)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, target)  # a crash leaves the old state or the new one, never half of one


def boot_id(host: Host) -> str | None:
    return host.read_str(BOOT_ID)


@contextlib.contextmanager
def setup_lock(host: Host) -> Iterator[None]:
    path = host.path(LOCK_FILE)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot create the lock file {LOCK_FILE}", fix="run as root") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise SetupLocked(
                "another belugactl setup or teardown is running on this host",
                why=f"{LOCK_FILE} is locked (held by pid {holder})",
                fix="wait for it to finish; the lock is released when that process exits",
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock
