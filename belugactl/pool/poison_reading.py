"""Where a pool device's poisoned lines lie in the pool: region poison records placed as pool-relative
byte ranges. Doctor's `cxl.media-errors` and the metadata server's periodic check (mds/poison.py)
place them the same way, with `place_records`.

A record's offset is from its region's base (HPA: interleave already accounted for); the pool starts
at the dax device's physical address (a devdax namespace puts it after its info block), and ends at
the device's size. Records outside that are not the pool's.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from belugactl.host.host import Host
from belugactl.host.read_cxl_health import read_region_poison
from belugactl.host.snapshot import MediaError

DAX_DEVICES = "/sys/bus/dax/devices"

# What a reader returns: pool-relative (offset, length) ranges, or None when the lists could not be
# read; and the problem, if any.
Reading = tuple[list[tuple[int, int]] | None, str | None]


def place_records(
    region_base: int, dax_base: int, dax_size: int, records: list[MediaError]
) -> tuple[list[tuple[int, int, MediaError]], list[MediaError]]:
    """(pool offset, length, record) of the records inside the dax device, clipped to it; and the
    records outside it."""
    inside: list[tuple[int, int, MediaError]] = []
    outside: list[MediaError] = []
    for rec in records:
        start = region_base + rec.offset - dax_base
        lo, hi = max(start, 0), min(start + rec.length, dax_size)
        if lo >= hi:
            outside.append(rec)
        else:
            inside.append((lo, hi - lo, rec))
    return inside, outside


def read_pool_poison(host: Host, dax_name: str) -> Reading:
    """The dax device's poisoned ranges, pool-relative, from `cxl list -R -L` and the device's sysfs."""
    base = host.read_int(f"{DAX_DEVICES}/{dax_name}/resource")
    size = host.read_int(f"{DAX_DEVICES}/{dax_name}/size")
    if base is None or not size:
        return None, f"{DAX_DEVICES}/{dax_name}: resource or size not readable (its physical address places poison)"
    problems: list[str] = []
    regions = read_region_poison(host, problems)
    if regions is None:
        return None, problems[0] if problems else "poison lists not read"
    ranges: list[tuple[int, int]] = []
    for r in regions:
        if r.resource is None or not r.size or not r.resource <= base < r.resource + r.size:
            continue  # not the region the pool is in
        inside, _outside = place_records(r.resource, base, size, r.records)
        ranges += [(off, n) for off, n, _rec in inside]
    return ranges, None


def device_poison_reader(pool_path: str | os.PathLike[str], host: Host | None = None) -> Callable[[], Reading] | None:
    """A reader for the pool at `pool_path` when it is a dax device (`/dev/daxX.Y`), else None."""
    name = os.path.basename(os.path.realpath(os.fspath(pool_path)))
    if not name.startswith("dax"):
        return None
    machine = host or Host.local()
    return lambda: read_pool_poison(machine, name)
