"""Which memdevs a region is built from: the manifest's `pool.source.memdevs` applied to a host's memdevs.

Setup (the region it creates) and doctor (`cxl.memdevs-present`) both ask this module, so they
choose the same devices and, when the manifest's selection cannot be met, say the same thing.

The three forms of the manifest (docs/manifest.md):
- `all`: every enabled memdev with capacity of the region's type;
- a list of serials: exactly those, in the order written;
- `{switch: BDF | any, count: N}`: the enabled memdevs with capacity behind that switch (or behind
  the one switch this host has), then the first N of them by serial.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from belugactl.errors import InputError
from belugactl.host.snapshot import CxlMemdev, CxlState
from belugactl.units import format_size

FIELD = "pool.source.memdevs"


@dataclass(frozen=True)
class MemdevWant:
    """The manifest's selection, as plain values (all None: `memdevs: all`)."""

    serials: tuple[str, ...] | None = None  # as written in the manifest ("16", "0x10"), in that order
    switch: str | None = None  # the switch's upstream port ("0000:0d:00.0"), or "any"
    count: int | None = None  # the first N by serial

    @classmethod
    def from_manifest(cls, selection: Any) -> MemdevWant:
        """From `RegionSource.memdevs`: "all", a list of serials, or a `MemdevPick`."""
        if selection == "all" or selection is None:
            return cls()
        if isinstance(selection, list | tuple):
            return cls(serials=tuple(str(s) for s in selection))
        return cls(switch=getattr(selection, "switch", None), count=getattr(selection, "count", None))

    @property
    def by_place(self) -> bool:
        """Chosen by switch and/or count (the mapping form)."""
        return self.switch is not None or self.count is not None

    def describe(self) -> str:
        """The selection as an operator reads it: 'the first 2 by serial behind the one switch'."""
        if self.serials is not None:
            return "serials " + ", ".join(_show_serial(s) for s in self.serials) + " (in that order)"
        if not self.by_place:
            return "all (every memdev with capacity of the region's type, by serial)"
        where = (
            "behind the one switch this host has"
            if self.switch == "any"
            else f"behind switch {self.switch}"
            if self.switch
            else "with capacity of the region's type"
        )
        if self.count is None:
            return f"every memdev {where}, by serial"
        return f"the first {self.count} by serial {where}"


class MemdevSelectionError(InputError):
    """The manifest's memdev selection cannot be met by this host's memdevs (exit 2)."""


def choose_memdevs(
    memdevs: Sequence[CxlMemdev], want: MemdevWant, region_type: str | None, *, placed: bool = True
) -> list[CxlMemdev]:
    """The memdevs the region is built from, in interleave-position order.

    `region_type` ("pmem", "ram", or None for any) decides which memdevs have capacity. `placed`:
    the facts include each memdev's PCI path (sysfs was read; see `placed_facts`), so a memdev with
    no switch is known to have none. Returns an empty list for `all` when nothing qualifies (setup
    says so in its own words); every other form that cannot be met raises MemdevSelectionError with
    what was asked, what was found, and the fix.
    """
    if want.serials is not None:
        return _by_serials(memdevs, want.serials)
    usable = [m for m in memdevs if m.state != "disabled" and _capacity(m, region_type) > 0]
    if want.switch is not None:
        usable = _behind_switch(memdevs, usable, want.switch, region_type, placed)
    chosen = _serial_order(usable)
    if want.count is None:
        return chosen
    if len(chosen) < want.count:
        raise MemdevSelectionError(
            f"{FIELD}.count is {want.count}, but this host has {len(chosen)} enabled memdev(s) with "
            f"{region_type or 'any'} capacity{_where(want.switch, memdevs)}",
            why=_found(memdevs, region_type),
            fix=f"enable or attach the missing devices (`cxl list -M`; a disabled one: cxl enable-memdev memN), "
            f"or lower {FIELD}.count and pool.interleave.ways together (every host must agree)",
        )
    if len(chosen) > want.count and any(m.serial is None for m in chosen):
        raise MemdevSelectionError(
            f"{FIELD}.count picks {want.count} of {len(chosen)} memdevs by serial, but not every memdev "
            "reports a serial",
            why=_found(memdevs, region_type),
            fix="upgrade the kernel or ndctl until `cxl list -M` shows each memdev's serial, or drop count "
            "and take every memdev (switch alone, or all)",
        )
    return chosen[: want.count]


def _by_serials(memdevs: Sequence[CxlMemdev], serials: tuple[str, ...]) -> list[CxlMemdev]:
    by_serial = {str(m.serial): m for m in memdevs if m.serial is not None}
    by_serial.update({hex(m.serial): m for m in memdevs if m.serial is not None})
    missing = [s for s in serials if s not in by_serial]
    if missing:
        raise MemdevSelectionError(
            f"memdev serial(s) {', '.join(_show_serial(s) for s in missing)} named in {FIELD} are not on this host",
            why=_found(memdevs, None),
            fix=f"check cabling and `cxl list -M`, or correct {FIELD}",
        )
    return [by_serial[s] for s in serials]


def placed_facts(cxl: CxlState) -> bool:
    """Whether discovery read /sys/bus/cxl, where a memdev's PCI path (and so its switch) comes from."""
    return cxl.source is None or "sysfs" in cxl.source


def _behind_switch(
    memdevs: Sequence[CxlMemdev], usable: list[CxlMemdev], switch: str, region_type: str | None, placed: bool
) -> list[CxlMemdev]:
    if not placed:
        # Facts from `cxl list` alone: its JSON has no PCI path, so no switch.
        raise MemdevSelectionError(
            f"{FIELD}.switch is {switch}, but this host's facts do not say which switch a memdev is behind",
            why=_found(memdevs, region_type) + "; discovery read no PCI path for them (is /sys/bus/cxl readable?)",
            fix=f"run where /sys is mounted (`belugactl discover` shows 'behind switch'), or list serials in {FIELD}",
        )
    switches = sorted({m.switch for m in memdevs if m.switch is not None})
    if switch == "any":
        if len(switches) != 1:
            what = (
                "no memdev on this host sits behind a CXL switch"
                if not switches
                else f"this host's memdevs sit behind {len(switches)} switches ({', '.join(switches)})"
            )
            fix = (
                "these memdevs hang directly off root ports: drop switch (count alone, or memdevs: all)"
                if not switches
                else f'name one: {FIELD}.switch: "{switches[0]}"'
            )
            raise MemdevSelectionError(
                f"{FIELD}.switch is any, which needs exactly one switch, but {what}",
                why=_found(memdevs, region_type),
                fix=fix + f", or list serials in {FIELD}",
            )
        switch = switches[0]
    behind = [m for m in usable if m.switch == switch]
    if not behind:
        seen = [m.name for m in memdevs if m.switch == switch]
        what = (
            f"no memdev behind switch {switch} has {region_type or 'any'} capacity and is enabled"
            if seen
            else f"no memdev on this host is behind switch {switch}"
        )
        raise MemdevSelectionError(
            f"{FIELD}.switch: {what}",
            why=_found(memdevs, region_type),
            fix=(
                f"the switches this host sees: {', '.join(switches)}; "
                if switches
                else "no memdev here sits behind a switch; "
            )
            + f"correct {FIELD}.switch (the PCI address of the switch's upstream port, `lspci -t`; "
            "or switch: any), or check the switch's binding of devices to this host",
        )
    return behind


def _serial_order(chosen: list[CxlMemdev]) -> list[CxlMemdev]:
    # Interleave position follows this order, so it must be the same on every host: by serial (the
    # device's own identity). Names follow probe order, which changes between boots (seen in the ram
    # lab: mem0 was serial 0x10 on one guest and 0x11 on another). By name only when a tool version
    # reports no serials.
    if chosen and all(m.serial is not None for m in chosen):
        return sorted(chosen, key=lambda m: int(m.serial or 0))
    return sorted(chosen, key=lambda m: natural_key(m.name))


def natural_key(name: str) -> tuple[str, int]:
    """Sort key for kernel names: mem2 before mem10."""
    m = re.match(r"(\D*)(\d+)", name)
    return (m[1], int(m[2])) if m else (name, -1)


def _capacity(memdev: CxlMemdev, region_type: str | None) -> int:
    if region_type == "ram":
        return memdev.ram_size or 0
    if region_type == "pmem":
        return memdev.pmem_size or 0
    return (memdev.ram_size or 0) + (memdev.pmem_size or 0)


def _where(switch: str | None, memdevs: Sequence[CxlMemdev]) -> str:
    if switch is None:
        return ""
    if switch == "any":
        found = {m.switch for m in memdevs if m.switch}
        return f" behind its one switch {found.pop()}" if len(found) == 1 else " behind its switch"
    return f" behind switch {switch}"


def _show_serial(serial: str) -> str:
    try:
        return f"0x{int(serial, 0):x}"
    except ValueError:
        return serial


def describe_memdev(m: CxlMemdev, region_type: str | None = None) -> str:
    """'mem0 (serial 0x11, behind switch 0000:0d:00.0, 256 MiB ram)': what a selection error lists."""
    serial = f"0x{m.serial:x}" if m.serial is not None else "no serial"
    if m.switch:
        place = f"behind switch {m.switch}"
    elif m.root_port:
        place = f"on root port {m.root_port}, no switch"
    else:
        place = "no switch found"  # on the root complex, or facts without a PCI path
    if region_type in ("ram", "pmem"):
        size = f"{format_size(_capacity(m, region_type))} {region_type}"
    else:
        size = f"{format_size(m.ram_size or 0)} ram, {format_size(m.pmem_size or 0)} pmem"
    state = ", disabled" if m.state == "disabled" else ""
    return f"{m.name} ({serial}, {place}, {size}{state})"


def _found(memdevs: Sequence[CxlMemdev], region_type: str | None) -> str:
    if not memdevs:
        return "memdevs found: none (`cxl list -M` shows nothing)"
    return "memdevs found: " + "; ".join(describe_memdev(m, region_type) for m in _serial_order(list(memdevs)))
