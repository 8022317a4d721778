"""What a host has now, as setup sees it: the discovery snapshot plus what only setup tracks.

The snapshot comes from the discovery workflow (one reader per fact, in `belugactl.host.read_*`);
setup adds its own state file, the boot id (MTRRs and permissions vanish at reboot), the number
of variable MTRRs, and the bytes at the start of the pool where the header lives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from belugactl.errors import BelugaError
from belugactl.host.host import Host
from belugactl.host.snapshot import HostSnapshot
from belugactl.host.write_mtrr import variable_mtrr_count
from belugactl.host.write_state import boot_id, empty_state
from belugactl.host.write_udev import RULE_FILE

Discover = Callable[[Host], HostSnapshot]


@dataclass
class SetupFacts:
    snapshot: HostSnapshot
    state: dict[str, Any] = field(default_factory=empty_state)
    boot_id: str | None = None
    mtrr_count: int | None = None  # variable MTRRs the CPU has; None: unknown
    header_bytes: bytes | None = None  # the first bytes of the pool device; None: not readable (yet)
    header_error: str | None = None
    udev_rule: str | None = None  # the text of setup's udev rule file, when present


def discovery_topics(target: Any, state: dict[str, Any] | None = None) -> frozenset[str]:
    """What setup reads of a host for `target`: the PCI walk only when it manages DDIO or has DDIO
    bits to restore (root ports), tool versions only for a ram region (refused below ndctl 77).
    The rest is sysfs files and the three listings setup cannot do without."""
    from belugactl.workflows.discover import TOPICS

    skip = set()
    saved_ddio = bool((state or {}).get("previous", {}).get("ddio"))
    if getattr(target, "ddio", "unmanaged") == "unmanaged" and not saved_ddio:
        skip.add("pci")
    pool = getattr(target, "pool", None)
    if pool is None or pool.source != "cxl-region" or pool.region_type != "ram":
        skip.add("tools")
    return TOPICS - skip


def default_discover(host: Host, target: Any = None, state: dict[str, Any] | None = None) -> HostSnapshot:
    from belugactl.workflows.discover import discover

    return discover(host, discovery_topics(target, state) if target is not None else None)


def read_header_bytes(host: Host, device: str, size: int) -> tuple[bytes | None, str | None]:
    from belugactl.pool.mapping import PoolMapping

    try:
        with PoolMapping.window(host, device, size, writable=False) as window:
            return window.read(0, size), None
    except BelugaError as exc:
        return None, exc.what


def observe(host: Host, target: Any, state: dict[str, Any], *, discover: Discover | None = None) -> SetupFacts:
    snapshot = discover(host) if discover is not None else default_discover(host, target, state)
    facts = SetupFacts(
        snapshot=snapshot,
        state=state,
        boot_id=boot_id(host),
        mtrr_count=variable_mtrr_count(host),
        udev_rule=host.read_text(RULE_FILE),
    )
    if target.header is not None:
        from belugactl.workflows.setup.steps_pool import pool_dax_device

        device = pool_dax_device(target, facts)
        if device is not None:
            facts.header_bytes, facts.header_error = read_header_bytes(host, f"/dev/{device}", target.header.map_size)
    return facts
