"""Memory device health (`cxl list -M -H`) and poison lists (`cxl list -R -L`), read as facts.

Field names are ndctl's (cxl/json.c `util_cxl_memdev_health_to_json`, cxl/json.c poison records;
Documentation/cxl/cxl-list.txt). Two rules shape what "nothing" means here:
- a device whose health mailbox command fails is printed without a `health` object: not reported;
- `-L` prints `media_errors` only when there are records, so a region listed with `-L` and without
  the key has none; but `cxl list` prints the objects even when tracefs or the device's poison list
  could not be read (it says so on stderr only), so a listing with anything on stderr, a failure,
  or a `cxl` older than 80 (no `-L`: a usage error) counts as not read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from belugactl.errors import ToolOutputError
from belugactl.host.command_runner import CommandResult
from belugactl.host.host import Host
from belugactl.host.read_tools import LIST_TIMEOUT_S, as_bool, as_hex, as_int, as_size, as_str, parse_list_output
from belugactl.host.snapshot import MediaError, MemdevHealth

HEALTH_LIST = ("cxl", "list", "-M", "-H", "-i")
MEDIA_ERRORS_LIST = ("cxl", "list", "-R", "-L", "-i")

# The poison lists come from each device's mailbox through trace events: seconds per device under
# emulation (a TCG lab guest: about 10 s), so a listing that timed out among discovery's parallel
# listings (LIST_TIMEOUT_S each) is read once more, alone, with this long.
MEDIA_ERRORS_TIMEOUT_S = 60.0

# ndctl's option parser exits 129 on an unknown switch (an ndctl older than the option).
_USAGE_EXIT = 129
_NO_MATCH_WARNING = "no matching devices found"

_BOOL_FIELDS = tuple(f.name for f in dataclasses.fields(MemdevHealth) if f.type == "bool | None")
_STR_FIELDS = tuple(f.name for f in dataclasses.fields(MemdevHealth) if f.type == "str | None")
_INT_FIELDS = tuple(f.name for f in dataclasses.fields(MemdevHealth) if f.type == "int | None")


def parse_health(obj: Any) -> MemdevHealth | None:
    """A memdev's `health` object; None when the listing has none for it."""
    if not isinstance(obj, dict):
        return None
    values: dict[str, Any] = {}
    for name in _BOOL_FIELDS:
        values[name] = as_bool(obj.get(name))
    for name in _STR_FIELDS:
        values[name] = as_str(obj.get(name))
    for name in _INT_FIELDS:
        values[name] = as_int(obj.get(name))
    return MemdevHealth(**values)


def parse_media_errors(records: Any) -> list[MediaError]:
    """A `media_errors` array; records without an offset are dropped (nothing to place them by)."""
    out: list[MediaError] = []
    if not isinstance(records, list):
        return out
    for rec in records:
        if not isinstance(rec, dict):
            continue
        offset = as_hex(rec.get("offset"))
        length = as_size(rec.get("length"))
        if offset is None or length is None:
            continue
        out.append(MediaError(offset, length, as_str(rec.get("source")), as_str(rec.get("flags")) or None))
    return out


def _objects(data: list[Any], key: str) -> list[dict[str, Any]]:
    """Objects named by `key` in a flat or wrapped listing (`[{"regions": [...]}]`)."""
    found: list[dict[str, Any]] = []
    for item in data:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get(key), str):
            found.append(item)
            continue
        for value in item.values():
            if isinstance(value, list):
                found += _objects(value, key)
    return found


def _stderr_problem(stderr: str) -> str | None:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and _NO_MATCH_WARNING not in ln]
    return lines[0] if lines else None


def read_health(host: Host, problems: list[str]) -> dict[str, MemdevHealth]:
    """Health by memdev name, for the memdevs that reported one."""
    result = host.run(list(HEALTH_LIST), timeout=LIST_TIMEOUT_S)
    if result.not_found or result.returncode == _USAGE_EXIT:
        return {}
    try:
        data = parse_list_output(result)
    except ToolOutputError as exc:
        problems.append(f"{exc.what}: {exc.why}" if exc.why else exc.what)
        return {}
    out: dict[str, MemdevHealth] = {}
    for obj in _objects(data, "memdev"):
        health = parse_health(obj.get("health"))
        if health is not None:
            out[obj["memdev"]] = health
    return out


def _run_media_errors(host: Host) -> CommandResult:
    result = host.run(list(MEDIA_ERRORS_LIST), timeout=LIST_TIMEOUT_S)
    if result.timed_out:  # among the parallel listings: once more, alone, with longer
        result = host.run(list(MEDIA_ERRORS_LIST), timeout=MEDIA_ERRORS_TIMEOUT_S)
    return result


def read_media_errors(host: Host, problems: list[str]) -> dict[str, list[MediaError]] | None:
    """Poison records by region name ([] for a region read clean); None when they could not be read."""
    result = _run_media_errors(host)
    if result.not_found or result.returncode == _USAGE_EXIT:
        return None
    try:
        data = parse_list_output(result)
    except ToolOutputError as exc:
        problems.append(f"{exc.what}: {exc.why}" if exc.why else exc.what)
        return None
    trouble = _stderr_problem(result.stderr)
    if trouble is not None:
        problems.append(f"`{' '.join(MEDIA_ERRORS_LIST)}`: poison lists not read: {trouble}")
        return None
    return {obj["region"]: parse_media_errors(obj.get("media_errors")) for obj in _objects(data, "region")}


@dataclasses.dataclass(frozen=True)
class RegionPoison:
    """One region's poison records with where the region lies (HPA base and size, from the same
    listing), so a reader without a discovery snapshot can place them (the metadata server's check)."""

    name: str
    resource: int | None
    size: int | None
    records: list[MediaError]


def read_region_poison(host: Host, problems: list[str]) -> list[RegionPoison] | None:
    """`cxl list -R -L` with each region's base: None when the poison lists could not be read."""
    result = host.run(list(MEDIA_ERRORS_LIST), timeout=MEDIA_ERRORS_TIMEOUT_S)
    if result.not_found or result.returncode == _USAGE_EXIT:
        problems.append(f"`{' '.join(MEDIA_ERRORS_LIST)}`: no cxl tool with -L (ndctl 80 or newer)")
        return None
    try:
        data = parse_list_output(result)
    except ToolOutputError as exc:
        problems.append(f"{exc.what}: {exc.why}" if exc.why else exc.what)
        return None
    trouble = _stderr_problem(result.stderr)
    if trouble is not None:
        problems.append(f"`{' '.join(MEDIA_ERRORS_LIST)}`: poison lists not read: {trouble}")
        return None
    return [
        RegionPoison(obj["region"], as_hex(obj.get("resource")), as_size(obj.get("size")),
                     parse_media_errors(obj.get("media_errors")))  # fmt: skip
        for obj in _objects(data, "region")
    ]
