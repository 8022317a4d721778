"""/proc/mtrr: the variable-range MTRRs (reference ops-cli.md 2.1).

Line format (kernel `mtrr_seq_show`):
`reg00: base=0x0c0000000 ( 3072MB), size= 1024MB, count=1: uncachable`; the size unit is K or M.
"""

from __future__ import annotations

import re

from belugactl.host.host import Host
from belugactl.host.snapshot import MtrrEntry

PROC_MTRR = "/proc/mtrr"

_LINE = re.compile(
    r"^reg(?P<reg>\d+):\s*base=(?P<base>0x[0-9a-fA-F]+)\s*\(\s*\d+MB\),\s*"
    r"size=\s*(?P<size>\d+)(?P<unit>[KMG])B,\s*count=(?P<count>\d+):\s*(?P<type>[\w-]+)\s*$"
)
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def read_mtrr(host: Host, problems: list[str]) -> list[MtrrEntry] | None:
    text = host.read_text(PROC_MTRR)
    if text is None:
        return None
    entries, bad = parse_mtrr(text)
    problems.extend(f"{PROC_MTRR}: cannot parse line {line!r}" for line in bad)
    return entries


def parse_mtrr(text: str) -> tuple[list[MtrrEntry], list[str]]:
    entries: list[MtrrEntry] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if not match:
            bad.append(line)
            continue
        entries.append(
            MtrrEntry(
                reg=int(match["reg"]),
                base=int(match["base"], 16),
                size=int(match["size"]) * _UNIT[match["unit"]],
                type=match["type"],
                count=int(match["count"]),
            )
        )
    return entries, bad
