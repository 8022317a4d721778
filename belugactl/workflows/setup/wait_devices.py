"""`setup --wait-devices SECONDS`: wait, bounded, for the manifest's memory devices to appear.

A large CXL device can show up seconds after boot (xcena-dev/maru #68: it then never joins);
the boot unit runs setup early, so it first waits for the devices the manifest names (by serial,
or a count) and says which are still missing when the time is up. The clock, the pause and the
reader are injectable, so tests replay a sequence of recorded hosts without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from belugactl.errors import EnvironmentProblem
from belugactl.host.host import Host
from belugactl.host.snapshot import CxlMemdev
from belugactl.workflows.setup.target import PoolTarget

POLL_INTERVAL_S = 1.0
# A wait longer than this would hold the boot for a device that is not coming; systemd's own
# start timeout (90 s by default) must cover it too.
MAX_WAIT_S = 600.0


@dataclass(frozen=True)
class DeviceWant:
    """What the manifest needs present: named serials (as written) or a number of memdevs."""

    serials: tuple[str, ...] = ()
    count: int = 1

    def describe(self) -> str:
        if self.serials:
            return "memdev serial(s) " + ", ".join(_show(s) for s in self.serials)
        return f"{self.count} memdev(s)"


@dataclass(frozen=True)
class WaitResult:
    want: DeviceWant
    missing: tuple[str, ...]  # serials still absent (as written), or "N more memdev(s)"
    reads: int
    waited_s: float
    found: tuple[str, ...]  # memdev names seen at the last read

    @property
    def complete(self) -> bool:
        return not self.missing


def want_for(pool: PoolTarget) -> DeviceWant | None:
    """What to wait for; None for a pool on an existing dax device (no memdevs to wait for)."""
    if pool.source != "cxl-region":
        return None
    if pool.memdev_serials:
        return DeviceWant(serials=pool.memdev_serials)
    # "all" or switch/count: the count, or the interleave ways, is the number the region needs.
    return DeviceWant(count=max(pool.memdev_count or 0, pool.ways or 1, 1))


def _show(serial: str) -> str:
    try:
        return f"0x{int(serial, 0):x}"
    except ValueError:
        return serial


def _missing(want: DeviceWant, memdevs: Sequence[CxlMemdev]) -> tuple[str, ...]:
    if want.serials:
        present = {str(m.serial) for m in memdevs if m.serial is not None}
        present |= {hex(m.serial) for m in memdevs if m.serial is not None}
        return tuple(s for s in want.serials if s not in present and _show(s) not in present)
    short = want.count - len(memdevs)
    return (f"{short} more memdev(s)",) if short > 0 else ()


def wait_for_devices(
    read: Callable[[], Sequence[CxlMemdev]],
    want: DeviceWant,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
    interval_s: float = POLL_INTERVAL_S,
) -> WaitResult:
    """Read the memdevs until `want` is met or `timeout_s` has passed; at least one read."""
    start = clock()
    reads = 0
    while True:
        memdevs = read()
        reads += 1
        missing = _missing(want, memdevs)
        elapsed = clock() - start
        if not missing or elapsed >= timeout_s:
            return WaitResult(want, missing, reads, elapsed, tuple(m.name for m in memdevs))
        pause(min(interval_s, max(timeout_s - elapsed, 0.0)))


def memdevs_on(host: Host) -> list[CxlMemdev]:
    """The memdevs present now, cheaply (a poll runs every second): /sys/bus/cxl's memX/serial where
    the bus is, else one `cxl list -M -i`; never the health or poison listings a full discovery runs."""
    from belugactl.host.read_cxl import OBJECT_LISTINGS, parse_cxl_list, read_cxl_sysfs
    from belugactl.host.read_tools import run_json

    if host.is_dir("/sys/bus/cxl"):
        found = read_cxl_sysfs(host).memdevs
        if found:
            return found
    return parse_cxl_list(run_json(host, OBJECT_LISTINGS[0], []) or []).memdevs


def wait_or_fail(host: Host, pool: PoolTarget, timeout_s: float, *, say: Callable[[str], None]) -> WaitResult | None:
    """The setup command's wait: progress lines through `say`, EnvironmentProblem (exit 3) when the
    devices are still missing at the end, so the boot unit fails and the serve unit does not start."""
    want = want_for(pool)
    if want is None:
        say("wait-devices: the pool is an existing dax device; no memory devices to wait for")
        return None
    result = wait_for_devices(lambda: memdevs_on(host), want, timeout_s)
    if result.complete:
        say(f"wait-devices: {want.describe()} present after {result.waited_s:.1f} s ({result.reads} read(s))")
        return result
    missing = ", ".join(_show(s) if not s.endswith("memdev(s)") else s for s in result.missing)
    raise EnvironmentProblem(
        f"memory device(s) still missing after {timeout_s:g} s: {missing}",
        why=f"waited for {want.describe()}; present: {', '.join(result.found) or 'none'}",
        fix="check the adapter and switch cabling and `cxl list -M`; a device that appears later joins at the next "
        "`belugactl setup` (or restart belugactl-setup.service); a longer --wait-devices gives a slow device more time",
    )


def checked_seconds(value: float) -> float:
    """The flag's value, or UsageError (exit 2) saying the allowed range."""
    from belugactl.errors import UsageError

    if not 0 <= value <= MAX_WAIT_S:
        raise UsageError(
            f"--wait-devices {value:g} is out of range",
            why=f"the wait holds the boot; it is bounded to 0..{MAX_WAIT_S:g} seconds",
            fix="give the seconds a slow device needs to appear, e.g. --wait-devices 60",
        )
    return value
