"""Kernel facts: release, version, command line, lockdown mode, whether we run in a container."""

from __future__ import annotations

import re

from belugactl.host.host import Host
from belugactl.host.snapshot import KernelInfo

LOCKDOWN = "/sys/kernel/security/lockdown"
# Markers container runtimes leave (docker, podman, systemd-nspawn/lxc).
_CONTAINER_FILES = ("/.dockerenv", "/run/.containerenv")
_CONTAINER_CGROUP = re.compile(r"docker|kubepods|containerd|lxc|libpod|crio", re.IGNORECASE)


def read_kernel(host: Host, problems: list[str]) -> KernelInfo:
    release = host.read_str("/proc/sys/kernel/osrelease")
    if release is None:
        problems.append("/proc/sys/kernel/osrelease is not readable: kernel release unknown")
    lockdown, available = parse_lockdown(host.read_str(LOCKDOWN))
    return KernelInfo(
        release=release,
        version=host.read_str("/proc/sys/kernel/version"),
        cmdline=host.read_str("/proc/cmdline"),
        lockdown=lockdown,
        in_container=_in_container(host),
        lockdown_available=available,
    )


def parse_lockdown(text: str | None) -> tuple[str | None, list[str]]:
    """`none [integrity] confidentiality` -> ("integrity", [all three])."""
    if not text:
        return None, []
    choices = [c.strip("[]") for c in text.split()]
    active = next((c.strip("[]") for c in text.split() if c.startswith("[")), None)
    return active, choices


def _in_container(host: Host) -> bool:
    if any(host.exists(p) for p in _CONTAINER_FILES):
        return True
    marker = host.read_str("/run/systemd/container")
    if marker:
        return True
    cgroup = host.read_text("/proc/1/cgroup") or ""
    return bool(_CONTAINER_CGROUP.search(cgroup))
