"""/proc/cpuinfo: vendor, family/model (DDIO exists on Intel only), flags, sockets."""

from __future__ import annotations

from belugactl.host.host import Host
from belugactl.host.snapshot import CpuInfo

PROC_CPUINFO = "/proc/cpuinfo"


def read_cpu(host: Host, problems: list[str]) -> CpuInfo:
    text = host.read_text(PROC_CPUINFO)
    if text is None:
        problems.append(f"{PROC_CPUINFO} is not readable: CPU vendor unknown")
        return CpuInfo()
    return parse_cpuinfo(text)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0)
    except ValueError:
        return None


def parse_cpuinfo(text: str) -> CpuInfo:
    first: dict[str, str] = {}
    sockets: set[str] = set()
    cpus = 0
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        cpus += 1
        if "physical id" in fields:
            sockets.add(fields["physical id"])
        if not first:
            first = fields
    flags = frozenset(first.get("flags", "").split())
    return CpuInfo(
        vendor=first.get("vendor_id"),
        model_name=first.get("model name"),
        family=_int(first.get("cpu family")),
        model=_int(first.get("model")),
        flags=flags,
        # No "physical id" lines (some guests): one socket is all that can be said.
        sockets=len(sockets) if sockets else (1 if cpus else None),
        cpus=cpus or None,
        stepping=_int(first.get("stepping")),
        hypervisor="hypervisor" in flags if first else None,
        phys_address_bits=_physical_bits(first.get("address sizes")),
    )


def _physical_bits(value: str | None) -> int | None:
    """ "46 bits physical, 48 bits virtual" -> 46."""
    words = (value or "").split()
    if len(words) >= 3 and words[1] == "bits" and words[2].rstrip(",") == "physical" and words[0].isdigit():
        return int(words[0])
    return None
