"""Discovery: read everything about one host into a HostSnapshot.

Each topic's reader runs on its own; one that fails (a missing file, output of the wrong shape,
even a bug) costs that topic only and is listed in `problems`, so `discover` and `doctor` always
get a snapshot back.

Speed (setup discovers before and after every step): on the live machine the tool invocations the
chosen topics need are started together up front (`host.prefetch`), tool versions are read once per
process, and a caller that needs only some facts names its `topics`; the others keep their empty
defaults and are listed in `HostSnapshot.topics_skipped`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from belugactl.host.capture import CaptureResult, tracing_host, write_bundle
from belugactl.host.host import Host
from belugactl.host.prefetch import prefetched
from belugactl.host.read_cpu import read_cpu
from belugactl.host.read_cxl import CXL_LIST_COMMANDS, read_cxl
from belugactl.host.read_dax import DAXCTL_LIST, read_dax
from belugactl.host.read_kernel import read_kernel
from belugactl.host.read_mtrr import read_mtrr
from belugactl.host.read_nd import NDCTL_LIST, read_nd
from belugactl.host.read_numa import HUGEPAGES_DIR, read_hugepage_dir, read_memory_policy, read_numa, read_thp
from belugactl.host.read_pci import read_pci
from belugactl.host.read_tools import LIST_TIMEOUT_S, VERSION_ARGV, VERSION_TIMEOUT_S, cached_tool, read_tools
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


# What `discover(host, topics=...)` can be asked for (udev facts come with "dax").
TOPICS = frozenset(
    {"tools", "cxl", "nd", "dax", "numa", "thp", "memory", "pci", "cpu", "kernel", "mtrr", "hugepages"}
)


def _tool_jobs(host: Host, wanted: frozenset[str]) -> list[tuple[tuple[str, ...], float]]:
    """The tool invocations the wanted topics will make, for running them together up front."""
    jobs: list[tuple[tuple[str, ...], float]] = []
    if "tools" in wanted:
        jobs += [(argv, VERSION_TIMEOUT_S) for name, argv in VERSION_ARGV.items() if cached_tool(host, name) is None]
    if "cxl" in wanted:
        jobs += [(tuple(argv), LIST_TIMEOUT_S) for argv in CXL_LIST_COMMANDS]
    if "nd" in wanted:
        jobs.append((NDCTL_LIST, LIST_TIMEOUT_S))
    if "dax" in wanted:
        jobs.append((DAXCTL_LIST, LIST_TIMEOUT_S))
    return jobs


def discover(
    host: Host, topics: Iterable[str] | None = None, *, concurrent: bool | None = None
) -> HostSnapshot:
    """Read `host` into a snapshot: every topic, or only `topics` (the others stay empty and are
    listed in `topics_skipped`). `concurrent` (default: on the live machine) starts the tool
    invocations together before the readers run."""
    wanted = TOPICS if topics is None else frozenset(topics)
    unknown = wanted - TOPICS
    if unknown:
        raise ValueError(f"unknown discovery topic(s): {', '.join(sorted(unknown))}")
    if concurrent is None:
        concurrent = host.is_live
    if not concurrent:
        return _discover(host, wanted)
    with prefetched(host, _tool_jobs(host, wanted)):
        return _discover(host, wanted)


def _discover(host: Host, wanted: frozenset[str]) -> HostSnapshot:
    problems: list[str] = []

    def topic(name: str, default: T, read: Callable[[], T]) -> T:
        return _guarded(name, problems, default, read) if name in wanted else default

    tools = topic("tools", {}, lambda: read_tools(host, problems))
    # udev tells the dax devices' /dev names: read with "dax", reported as "udev".
    with_dax = "dax" in wanted
    udev = _guarded("udev", problems, False, lambda: has_udev_db(host)) if with_dax else False
    devnames = _guarded("udev", problems, None, lambda: dax_devnames(host, problems)) if with_dax else None
    pci, root_ports = topic("pci", ([], []), lambda: read_pci(host, problems))
    return HostSnapshot(
        hostname=host.read_str("/proc/sys/kernel/hostname") or None,
        root=str(host.root),
        tools=tools,
        cxl=topic("cxl", CxlState(), lambda: read_cxl(host, problems)),
        nd=topic("nd", NdState(), lambda: read_nd(host, problems)),
        dax=topic("dax", [], lambda: read_dax(host, problems, devnames)),
        numa=topic("numa", [], lambda: read_numa(host, problems)),
        thp=topic("thp", Thp(), lambda: read_thp(host, problems)),
        memory=topic("memory", MemoryPolicy(), lambda: read_memory_policy(host, problems)),
        pci=pci,
        root_ports=root_ports,
        cpu=topic("cpu", CpuInfo(), lambda: read_cpu(host, problems)),
        kernel=topic("kernel", KernelInfo(), lambda: read_kernel(host, problems)),
        mtrr=topic("mtrr", None, lambda: read_mtrr(host, problems)),
        udev_db=udev,
        problems=problems,
        hugepages=topic("hugepages", {}, lambda: read_hugepage_dir(host, HUGEPAGES_DIR)),
        topics_skipped=sorted(TOPICS - wanted),
    )


# The snapshot fields each topic fills (everything else is host-wide: hostname, root).
TOPIC_FIELDS: dict[str, tuple[str, ...]] = {
    "tools": ("tools",), "cxl": ("cxl",), "nd": ("nd",), "dax": ("dax", "udev_db"), "numa": ("numa",),
    "thp": ("thp",), "memory": ("memory",), "pci": ("pci", "root_ports"), "cpu": ("cpu",),
    "kernel": ("kernel",), "mtrr": ("mtrr",), "hugepages": ("hugepages",),
}  # fmt: skip


def rediscover(host: Host, previous: HostSnapshot, topics: Iterable[str]) -> HostSnapshot:
    """`previous` with `topics` read again (only those `previous` had read); the rest kept as it was.

    Setup uses it after a step that can change only some facts (a THP setting, a hugepage count):
    under emulation a full discovery costs seconds, most of it the cxl/ndctl/daxctl listings."""
    fresh_topics = frozenset(topics) & (TOPICS - frozenset(previous.topics_skipped))
    if not fresh_topics:
        return previous
    fresh = discover(host, fresh_topics)
    fields = {name: getattr(fresh, name) for topic in fresh_topics for name in TOPIC_FIELDS[topic]}
    return dataclasses.replace(previous, **fields, problems=[*previous.problems, *fresh.problems])


def capture(host: Host, dest: Path | str) -> CaptureResult:
    """Discover `host` and write everything that was read to `dest` (FILE.tar.gz or a new directory)."""
    tracing = tracing_host(host)
    snapshot = discover(tracing)
    return write_bundle(tracing, snapshot, dest)
