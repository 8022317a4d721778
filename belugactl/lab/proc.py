"""Local process helpers for the lab: commands with a working directory, and pid checks via /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from belugactl.host.command_runner import RC_NOT_FOUND, RC_TIMEOUT, CommandResult


def run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 600.0) -> CommandResult:
    """Like SubprocessRunner.run, plus a working directory (apt-get download writes into it)."""
    args = tuple(str(a) for a in argv)
    start = time.monotonic()
    try:
        proc = subprocess.run(  # noqa: S603 - argv list, no shell
            list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        return CommandResult(args, RC_NOT_FOUND, "", str(exc), time.monotonic() - start, not_found=True)
    except subprocess.TimeoutExpired:
        return CommandResult(args, RC_TIMEOUT, "", "timed out", time.monotonic() - start, timed_out=True)
    return CommandResult(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def cmdline(pid: int, proc_root: Path = Path("/proc")) -> list[str] | None:
    """The argv of a live process, or None when it is gone (or a zombie, whose cmdline is empty)."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def is_zombie(pid: int, proc_root: Path = Path("/proc")) -> bool:
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may hold spaces.
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "Z"


def reap(pid: int) -> None:
    """Collect our own dead child so it does not linger as a zombie (no-op for others' processes)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, but belongs to another user
    return not is_zombie(pid)


def settled_cmdline(pid: int, *, wait_s: float = 1.0) -> list[str] | None:
    """The argv of a live process, waiting out the moment during exec() when /proc shows it empty."""
    deadline = time.monotonic() + wait_s
    while True:
        args = cmdline(pid)
        if args is not None or not alive(pid) or time.monotonic() >= deadline:
            return args
        time.sleep(0.01)


def terminate(pid: int, *, grace_s: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after `grace_s`; True once the process is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            reap(pid)
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.05)
    return not alive(pid)
