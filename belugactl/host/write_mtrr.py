"""`/proc/mtrr`: read the variable MTRRs, add an uncachable range, remove one by register number.

Format and rules from the kernel (arch/x86/kernel/cpu/mtrr/if.c): lines
`reg01: base=0x2080000000 (133120MB), size= 4096MB, count=1: uncachable`; control writes
`base=0x... size=0x... type=uncachable` and `disable=N`. Entries written through the text file
last until reboot or `disable`, so the caller remembers which ones it added.
"""

from __future__ import annotations

import errno
import os
import re

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host
from belugactl.host.snapshot import MtrrEntry

PROC_MTRR = "/proc/mtrr"
# IA32_MTRRCAP: bits 7:0 are VCNT, the number of variable-range MTRRs (Intel SDM vol. 3, 12.11.1).
MSR_MTRRCAP = 0xFE

_LINE = re.compile(
    r"^reg(?P<reg>\d+):\s*base=0x(?P<base>[0-9a-fA-F]+)\s*\(\s*\d+MB\),\s*size=\s*(?P<size>\d+)(?P<unit>[KMG])B,"
    r"\s*count=(?P<count>\d+):\s*(?P<type>[a-z-]+)"
)
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_mtrr(text: str) -> list[MtrrEntry]:
    entries = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        entries.append(
            MtrrEntry(
                reg=int(m["reg"]),
                base=int(m["base"], 16),
                size=int(m["size"]) * _UNITS[m["unit"]],
                type=m["type"],
                count=int(m["count"]),
            )
        )
    return entries


def read_mtrr(host: Host) -> list[MtrrEntry] | None:
    text = host.read_text(PROC_MTRR)
    return None if text is None else parse_mtrr(text)


def variable_mtrr_count(host: Host) -> int | None:
    """How many variable MTRRs the CPU has, from IA32_MTRRCAP through the msr driver (None: unknown)."""
    data = host.read_bytes("/dev/cpu/0/msr", 8, MSR_MTRRCAP)
    if not data or len(data) < 8:
        return None
    return int.from_bytes(data, "little") & 0xFF


def _write(host: Host, line: str) -> None:
    try:
        host.write_text(PROC_MTRR, line + "\n")
    except PermissionError as exc:
        raise EnvironmentProblem(
            "cannot write /proc/mtrr: permission denied",
            why=str(exc),
            fix="run belugactl setup as root (needs CAP_SYS_ADMIN)",
        ) from exc
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        hints = {
            "ENOSPC": "no free variable MTRR is left",
            "EINVAL": "the kernel rejected the range (base must be aligned to the size, both 4 KiB multiples)",
            "ENXIO": "MTRRs are disabled on this machine (common in VMs)",
            "ENODEV": "MTRRs are disabled on this machine (common in VMs)",
        }
        raise StepFailed(
            f"the kernel refused `{line}` in /proc/mtrr ({name})",
            why=hints.get(name, os.strerror(exc.errno or 0)),
            fix="see `cat /proc/mtrr` and dmesg for the kernel's reason",
        ) from exc


def add_mtrr(host: Host, base: int, size: int, type_: str = "uncachable") -> MtrrEntry:
    """Add one range; return the entry the kernel now lists for it (verified by reading back)."""
    before = {e.reg for e in read_mtrr(host) or []}
    _write(host, f"base=0x{base:x} size=0x{size:x} type={type_}")
    after = read_mtrr(host) or []
    match = [e for e in after if e.base == base and e.size == size and e.type == type_]
    if not match:
        raise StepFailed(
            f"/proc/mtrr does not list base=0x{base:x} size=0x{size:x} {type_} after adding it",
            why="the kernel accepted the write but kept no such entry",
            fix="check dmesg for `mtrr:` messages",
        )
    # Prefer the register that was not there before: that is the one this write created.
    fresh = [e for e in match if e.reg not in before]
    return (fresh or match)[0]


def remove_mtrr(host: Host, reg: int) -> None:
    _write(host, f"disable={reg}")
