"""libnvdimm state from `ndctl list -B -R -N`: nd regions and their namespaces.

With several object types ndctl nests them (buses hold `regions`, regions hold `namespaces`);
with one type it prints a flat array; with `-u` and one element, a bare object (reference
cxl-tooling.md 1.2). Objects are recognised by their fields, so every shape parses.

A namespace's label uuid (the one `create-namespace -u` pins) is not what ndctl prints as "uuid"
for devdax/fsdax: that is the info block's. It comes from "raw_uuid" when ndctl printed it (-v)
and from sysfs (/sys/bus/nd/devices/<dev>/uuid), which wins when both are there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from belugactl.host.host import Host
from belugactl.host.read_tools import as_hex, as_int, as_size, as_str, run_json
from belugactl.host.snapshot import NdNamespace, NdRegion, NdState

NDCTL_LIST = ("ndctl", "list", "-B", "-R", "-N")
ND_DEVICES = "/sys/bus/nd/devices"


def read_nd(host: Host, problems: list[str]) -> NdState:
    data = run_json(host, NDCTL_LIST, problems)
    if data is None:
        return NdState()
    regions, namespaces = parse_ndctl_list(data)
    namespaces = [_with_sysfs_label(host, ns) for ns in namespaces]
    return NdState(regions=regions, namespaces=namespaces, source="ndctl list")


def _with_sysfs_label(host: Host, ns: NdNamespace) -> NdNamespace:
    label = (host.read_str(f"{ND_DEVICES}/{ns.dev}/uuid") or "").strip().lower()
    # A label-less namespace prints nothing (or all zeros) there: keep what ndctl said.
    if not label or label.strip("0-") == "":
        return ns
    return dataclasses.replace(ns, label_uuid=label)


def parse_ndctl_list(data: Iterable[Any]) -> tuple[list[NdRegion], list[NdNamespace]]:
    regions: list[NdRegion] = []
    namespaces: list[NdNamespace] = []
    for item in data:
        _walk(item, None, None, regions, namespaces)
    return regions, namespaces


def _walk(
    obj: Any,
    bus: dict[str, Any] | None,
    region: str | None,
    regions: list[NdRegion],
    namespaces: list[NdNamespace],
) -> None:
    if isinstance(obj, list):
        for item in obj:
            _walk(item, bus, region, regions, namespaces)
        return
    if not isinstance(obj, dict):
        return
    dev = as_str(obj.get("dev")) or ""
    if "provider" in obj or dev.startswith("ndbus"):
        bus = obj
    elif dev.startswith("region"):
        region = dev
        regions.append(_region(obj, bus))
    elif dev.startswith("namespace"):
        namespaces.append(_namespace(obj, region))
    for key in ("regions", "namespaces"):
        if isinstance(obj.get(key), list):
            _walk(obj[key], bus, region, regions, namespaces)


def _node(value: Any) -> int | None:
    number = as_int(value)
    return number if number is not None and number >= 0 else None


def _region(obj: dict[str, Any], bus: dict[str, Any] | None) -> NdRegion:
    return NdRegion(
        dev=obj["dev"],
        size=as_size(obj.get("size")),
        align=as_size(obj.get("align")),
        available_size=as_size(obj.get("available_size")),
        type=as_str(obj.get("type")),
        numa_node=_node(obj.get("numa_node")),
        target_node=_node(obj.get("target_node")),
        provider=as_str(bus.get("provider")) if bus else None,
        bus=as_str(bus.get("dev")) if bus else None,
        persistence_domain=as_str(obj.get("persistence_domain")),
        state="disabled" if obj.get("state") == "disabled" else "enabled",
        iset_id=as_hex(obj.get("iset_id")),
    )


def _namespace(obj: dict[str, Any], region: str | None) -> NdNamespace:
    chardev = as_str(obj.get("chardev"))
    daxregion = obj.get("daxregion")
    if chardev is None and isinstance(daxregion, dict):
        # With -X the dax device sits inside the namespace's daxregion.
        devices = daxregion.get("devices")
        if isinstance(devices, list) and devices and isinstance(devices[0], dict):
            chardev = as_str(devices[0].get("chardev"))
    return NdNamespace(
        dev=obj["dev"],
        mode=as_str(obj.get("mode")),
        map=as_str(obj.get("map")),
        size=as_size(obj.get("size")),
        uuid=as_str(obj.get("uuid")),
        name=as_str(obj.get("name")),
        align=as_size(obj.get("align")),
        chardev=chardev,
        region=region,
        state="disabled" if obj.get("state") == "disabled" else "enabled",
        blockdev=as_str(obj.get("blockdev")),
        label_uuid=_lower(as_str(obj.get("raw_uuid"))),
    )


def _lower(value: str | None) -> str | None:
    return value.lower() if value else None
