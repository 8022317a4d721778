"""Several people serving on one machine (the CPU demo on a shared box): whose run dir, whose port.

- Run dirs are per user: `belugactl serve` as root (a boot unit, a root login) keeps the host-wide
  /run/belugactl/serve; root through sudo gets /run/belugactl/serve-<sudo user>, so two people who
  both `sudo belugactl serve` do not take over each other's state; others get their own state dir.
- A port already taken is reported with the process that holds it (pid, name, user), read with
  psutil, so the fix is obvious: stop that process, or change the manifest's ports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

HOST_RUN_DIR = Path("/run/belugactl/serve")


def per_user_run_dir(environ: Mapping[str, str] | None = None, *, euid: int | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("BELUGACTL_RUN_DIR")
    if explicit:
        return Path(explicit)
    uid = os.geteuid() if euid is None else euid
    if uid == 0:
        sudo_user = env.get("SUDO_USER", "")
        if sudo_user and sudo_user != "root" and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", sudo_user):
            return HOST_RUN_DIR.with_name(f"serve-{sudo_user}")
        return HOST_RUN_DIR
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "belugactl" / "serve"


def port_holders(ports: Iterable[int]) -> dict[int, str]:
    """For each port that something listens on: "pid N (name, user U)", or what can be said without
    permission to see other users' sockets."""
    wanted = set(ports)
    found: dict[int, str] = {}
    try:
        import psutil

        connections = psutil.net_connections(kind="inet")
    except Exception:  # noqa: BLE001 - psutil missing or not permitted: the caller says less, not nothing
        return found
    for conn in connections:
        laddr = conn.laddr
        port = getattr(laddr, "port", None)
        if port not in wanted or conn.status not in ("LISTEN", "NONE") or port in found:
            continue
        found[port] = describe_pid(conn.pid)
    return found


def describe_pid(pid: int | None) -> str:
    if pid is None:
        return "a process of another user (run as root to see which)"
    try:
        import psutil

        proc = psutil.Process(pid)
        name = proc.name()
        user = proc.username()
        cmdline = " ".join(proc.cmdline()[:4])
    except Exception:  # noqa: BLE001 - it may have exited since
        return f"pid {pid}"
    return f"pid {pid} ({name}, user {user}: {cmdline})"
