"""Pool device names and paths, and the one rule that decides which device (or file) is the pool.

The manifest stores dax device names without `/dev/` ("dax0.0"); everything that opens a device
gets its path from `device_path`. Which device is the pool is decided by `pool_device` alone:
`metadata-server`, `serve` and the rack probe all ask it. It never falls back to a guessed
device: mapping the wrong dax device would write KV blocks over someone else's data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from belugactl.errors import UsageError

DEV_DIR = "/dev/"

# A callable that finds the pool's dax device name ("dax0.0") on this host, or None when there is none
# yet (the region-source pool's namespace does not exist before `setup`).
DiscoverDevice = Callable[[], str | None]


class PoolDeviceUndecided(UsageError):
    """Which device is the pool cannot be decided from the flags, the manifest and this host."""


def device_path(name: str) -> str:
    """"dax0.0" -> "/dev/dax0.0"; a path ("/dev/dax0.0", "/srv/pool.raw") is returned unchanged."""
    if not name:
        raise ValueError("empty device name")
    return name if name.startswith("/") else DEV_DIR + name


def device_name(path: str) -> str:
    """"/dev/dax0.0" -> "dax0.0" (the manifest's spelling); a bare name is returned unchanged."""
    return path.removeprefix(DEV_DIR)


def is_device(path: str) -> bool:
    """True for a device node under /dev; False for a file pool (development, CI)."""
    return path.startswith(DEV_DIR)


def pool_device(
    manifest: Any,
    *,
    explicit: str | None = None,
    discover: DiscoverDevice | None = None,
    host_name: str | None = None,
) -> str:
    """The path of the pool on this host, by one rule.

    1. `--pool` wins: a /dev path as given, anything else a file pool (made absolute, because the
       processes serve starts run in other directories).
    2. A manifest whose pool source is a dax device names it.
    3. A region-source pool's device is what `discover` finds for the manifest's namespace.
    Otherwise PoolDeviceUndecided (exit 2) says how to decide it.
    """
    if explicit:
        return explicit if is_device(explicit) else str(Path(explicit).expanduser().resolve())
    source = manifest.pool.source
    if getattr(source, "kind", None) == "dax-device" and getattr(source, "device", None):
        return device_path(source.device)
    found = discover() if discover is not None else None
    if found:
        return device_path(found)
    where = f" on {host_name}" if host_name else ""
    raise PoolDeviceUndecided(
        f"cannot decide which device is the pool{where}",
        why=(
            "the manifest builds the pool from a CXL region and no dax device of its namespace exists here"
            if getattr(source, "kind", None) == "cxl-region"
            else "the manifest names no dax device"
        ),
        fix=(
            "name it in the manifest (pool.source: {kind: dax-device, device: daxX.Y}) or pass --pool "
            "/dev/daxX.Y (`belugactl discover` lists the dax devices); a region pool's device appears after "
            "`belugactl setup`"
        ),
    )
