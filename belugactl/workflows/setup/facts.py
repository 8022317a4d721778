"""What a host has now, as setup sees it: the discovery snapshot plus what only setup tracks.

Pure data. `observe.py` fills it: the snapshot comes from the discovery workflow (one reader per
fact, in `belugactl.host.read_*`), and each topic's `observe` hook adds what only it needs (the
state file's boot id and the MTRR count, the udev rule's text, the bytes where the header lives).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from belugactl.host.host import Host
from belugactl.host.setup_state import empty_state
from belugactl.host.snapshot import HostSnapshot

Discover = Callable[[Host], HostSnapshot]


@dataclass
class SetupFacts:
    snapshot: HostSnapshot
    state: dict[str, Any] = field(default_factory=empty_state)
    boot_id: str | None = None
    mtrr_count: int | None = None  # variable MTRRs the CPU has; None: unknown
    header_bytes: bytes | None = None  # the header area of the pool device; None: not readable (yet)
    header_error: str | None = None
    udev_rule: str | None = None  # the text of setup's udev rule file, when present
    extra: dict[str, Any] = field(default_factory=dict)  # what a newer topic's observe hook adds, by topic id
