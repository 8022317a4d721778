"""Discovery: read everything about one host into a HostSnapshot.

Each topic's reader runs on its own; one that fails (a missing file, output of the wrong shape,
even a bug) costs that topic only and is listed in `problems`, so `discover` and `doctor` always
get a snapshot back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from belugactl.host.capture import CaptureResult, tracing_host, write_bundle
from belugactl.host.host import Host
from belugactl.host.read_cpu import read_cpu
from belugactl.host.read_cxl import read_cxl
from belugactl.host.read_dax import read_dax
from belugactl.host.read_kernel import read_kernel
from belugactl.host.read_mtrr import read_mtrr
from belugactl.host.read_nd import read_nd
from belugactl.host.read_numa import HUGEPAGES_DIR, read_hugepage_dir, read_memory_policy, read_numa, read_thp
from belugactl.host.read_pci import read_pci
from belugactl.host.read_tools import read_tools
from belugactl.host.read_udev import dax_devnames, has_udev_db
from belugactl.host.snapshot import (
    CpuInfo,
    CxlState,
    HostSnapshot,
    KernelInfo,
    MemoryPolicy,
    NdState,
    Thp,
)

T = TypeVar("T")


def _guarded(topic: str, problems: list[str], default: T, read: Callable[[], T]) -> T:
    try:
        return read()
    except Exception as exc:  # a reader bug must not take the whole snapshot down
        problems.append(f"{topic}: reader failed: {type(exc).__name__}: {exc}")
        return default


def discover(host: Host) -> HostSnapshot:
    problems: list[str] = []
    tools = _guarded("tools", problems, {}, lambda: read_tools(host, problems))
    udev = _guarded("udev", problems, False, lambda: has_udev_db(host))
    devnames = _guarded("udev", problems, None, lambda: dax_devnames(host, problems))
    pci, root_ports = _guarded("pci", problems, ([], []), lambda: read_pci(host, problems))
    return HostSnapshot(
        hostname=host.read_str("/proc/sys/kernel/hostname") or None,
        root=str(host.root),
        tools=tools,
        cxl=_guarded("cxl", problems, CxlState(), lambda: read_cxl(host, problems)),
        nd=_guarded("nd", problems, NdState(), lambda: read_nd(host, problems)),
        dax=_guarded("dax", problems, [], lambda: read_dax(host, problems, devnames)),
        numa=_guarded("numa", problems, [], lambda: read_numa(host, problems)),
        thp=_guarded("thp", problems, Thp(), lambda: read_thp(host, problems)),
        memory=_guarded("memory", problems, MemoryPolicy(), lambda: read_memory_policy(host, problems)),
        pci=pci,
        root_ports=root_ports,
        cpu=_guarded("cpu", problems, CpuInfo(), lambda: read_cpu(host, problems)),
        kernel=_guarded("kernel", problems, KernelInfo(), lambda: read_kernel(host, problems)),
        mtrr=_guarded("mtrr", problems, None, lambda: read_mtrr(host, problems)),
        udev_db=udev,
        problems=problems,
        hugepages=_guarded("hugepages", problems, {}, lambda: read_hugepage_dir(host, HUGEPAGES_DIR)),
    )


def capture(host: Host, dest: Path | str) -> CaptureResult:
    """Discover `host` and write everything that was read to `dest` (FILE.tar.gz or a new directory)."""
    tracing = tracing_host(host)
    snapshot = discover(tracing)
    return write_bundle(tracing, snapshot, dest)
