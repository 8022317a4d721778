"""NUMA nodes, hugepages per node and size, THP mode, memory hotplug policy (sysfs).

Formats (reference cxl-tooling.md 3.3, ops-cli.md 5): `nodeN/cpulist` `0-3,8`; `nodeN/meminfo`
`Node 0 MemTotal:   5204184 kB`; `has_memory`/`has_cpu` are system-wide node lists; THP files
show the active choice in brackets; `block_size_bytes` is hex without `0x`.
"""

from __future__ import annotations

import re

from belugactl.host.host import Host
from belugactl.host.snapshot import HugepageCount, MemoryPolicy, NumaNode, Thp

NODE_DIR = "/sys/devices/system/node"
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
MEMORY_DIR = "/sys/devices/system/memory"
HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"

_MEMINFO = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?\s*$")
_HUGEPAGE_DIR = re.compile(r"^hugepages-(\d+)kB$")


def parse_list(text: str | None) -> list[int] | None:
    """A kernel list such as `0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11]; None when unparsable."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            return None
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """Per-node meminfo as {field: bytes (kB fields) or count (HugePages_*)}."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO.match(line.strip())
        if match:
            number = int(match.group(2))
            values[match.group(1)] = number * 1024 if line.rstrip().endswith("kB") else number
    return values


def read_hugepage_dir(host: Host, directory: str) -> dict[int, HugepageCount]:
    sizes: dict[int, HugepageCount] = {}
    for entry in host.listdir(directory):
        match = _HUGEPAGE_DIR.match(entry)
        if not match:
            continue
        base = f"{directory}/{entry}"
        sizes[int(match.group(1)) * 1024] = HugepageCount(
            total=host.read_int(f"{base}/nr_hugepages", 10),
            free=host.read_int(f"{base}/free_hugepages", 10),
            surplus=host.read_int(f"{base}/surplus_hugepages", 10),
        )
    return dict(sorted(sizes.items()))


def read_numa(host: Host, problems: list[str]) -> list[NumaNode]:
    if not host.is_dir(NODE_DIR):
        problems.append(f"{NODE_DIR} is missing: kernel without NUMA support, or /sys not mounted")
        return []
    with_memory = parse_list(host.read_str(f"{NODE_DIR}/has_memory"))
    with_cpu = parse_list(host.read_str(f"{NODE_DIR}/has_cpu"))
    ids = sorted(int(e[4:]) for e in host.listdir(NODE_DIR) if re.fullmatch(r"node\d+", e))
    nodes = []
    for node_id in ids:
        base = f"{NODE_DIR}/node{node_id}"
        cpus = parse_list(host.read_str(f"{base}/cpulist"))
        if cpus is None:
            problems.append(f"{base}/cpulist is missing or unparsable")
        meminfo_text = host.read_text(f"{base}/meminfo")
        meminfo = parse_meminfo(meminfo_text) if meminfo_text is not None else {}
        distance = host.read_str(f"{base}/distance")
        nodes.append(
            NumaNode(
                id=node_id,
                cpus=cpus or [],
                mem_total=meminfo.get("MemTotal"),
                mem_free=meminfo.get("MemFree"),
                hugepages=read_hugepage_dir(host, f"{base}/hugepages"),
                has_memory=node_id in with_memory if with_memory is not None else None,
                has_cpu=node_id in with_cpu if with_cpu is not None else None,
                distance=[int(d) for d in distance.split()] if distance and distance.replace(" ", "").isdigit() else [],
            )
        )
    return nodes


def parse_choice(text: str | None) -> tuple[str | None, list[str]]:
    """`always [madvise] never` -> ("madvise", ["always", "madvise", "never"])."""
    if not text:
        return None, []
    words = text.split()
    active = next((w.strip("[]") for w in words if w.startswith("[")), None)
    return active, [w.strip("[]") for w in words]


def read_thp(host: Host, problems: list[str]) -> Thp:
    enabled, enabled_choices = parse_choice(host.read_str(f"{THP_DIR}/enabled"))
    defrag, defrag_choices = parse_choice(host.read_str(f"{THP_DIR}/defrag"))
    if enabled is None and host.is_dir("/sys/kernel/mm"):
        problems.append(f"{THP_DIR}/enabled is missing: kernel without transparent hugepages")
    return Thp(
        enabled=enabled,
        defrag=defrag,
        available_enabled=enabled_choices,
        available_defrag=defrag_choices,
        hpage_pmd_size=host.read_int(f"{THP_DIR}/hpage_pmd_size", 10),
    )


def read_memory_policy(host: Host, problems: list[str]) -> MemoryPolicy:
    return MemoryPolicy(
        auto_online_blocks=host.read_str(f"{MEMORY_DIR}/auto_online_blocks") or None,
        memory_block_size=host.read_int(f"{MEMORY_DIR}/block_size_bytes", 16),
    )
