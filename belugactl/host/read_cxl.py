"""CXL state: `cxl list` JSON merged with /sys/bus/cxl.

`cxl list` (reference cxl-tooling.md 1.1) prints a flat array when one object type has results,
an array of single-key wrapper objects (`{"memdevs": [...]}`, `{"root decoders": [...]}`) when
several do, children nested under `"<type>:<parent>"` keys with `-B/-P`, and `[\\n]` or nothing at
all when there is nothing. `parse_cxl_list` accepts every one of those shapes. The kernel's sysfs
(section 3.1) fills what the tool did not print (or everything, when the tool is missing).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from belugactl.host.host import Host
from belugactl.host.read_cxl_health import HEALTH_LIST, MEDIA_ERRORS_LIST, read_health, read_media_errors
from belugactl.host.read_pci import BDF_RE, pci_chain, root_port_of, switch_upstream_port_of
from belugactl.host.read_tools import as_bool, as_hex, as_int, as_size, as_str, run_json
from belugactl.host.snapshot import CxlDecoder, CxlMemdev, CxlRegion, CxlState

CXL_DEVICES = "/sys/bus/cxl/devices"

# One object type per listing, so each prints a flat array (the documented shapes);
# the parser still accepts the mixed, wrapped shapes other flag sets produce.
OBJECT_LISTINGS: tuple[tuple[str, ...], ...] = (
    ("cxl", "list", "-M", "-i"),
    ("cxl", "list", "-D", "-d", "root"),
    ("cxl", "list", "-D", "-d", "endpoint"),
    ("cxl", "list", "-R", "-T", "-i"),
)
# Every `cxl list` discovery runs (started together up front). Health and poison lists are their
# own invocations, so a capture taken before discovery asked for them still replays the rest.
CXL_LIST_COMMANDS: tuple[tuple[str, ...], ...] = (*OBJECT_LISTINGS, HEALTH_LIST, MEDIA_ERRORS_LIST)

# Top-level wrapper keys (`cxl/filter.c` splice_array) -> what the array holds.
_WRAPPER_KINDS = {
    "anon memdevs": "memdev",
    "memdevs": "memdev",
    "buses": "bus",
    "ports": "port",
    "endpoints": "endpoint",
    "root decoders": "decoder:root",
    "port decoders": "decoder:switch",
    "endpoint decoders": "decoder:endpoint",
    "regions": "region",
}
_CHILD_KINDS = {
    "ports": "port",
    "endpoints": "endpoint",
    "memdevs": "memdev",
    "regions": "region",
    "decoders": "decoder",
}
_NAME_KEYS = ("memdev", "decoder", "region", "endpoint", "port", "bus")

T = TypeVar("T")


@dataclass
class CxlListing:
    """Objects found in `cxl list` output, whatever its shape."""

    memdevs: list[CxlMemdev] = field(default_factory=list)
    decoders: list[CxlDecoder] = field(default_factory=list)
    regions: list[CxlRegion] = field(default_factory=list)
    buses: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)


# --- `cxl list` -----------------------------------------------------------------------------


def parse_cxl_list(data: Iterable[Any], decoder_kind: str | None = None) -> CxlListing:
    """Every memdev, decoder, region, bus and port in a `cxl list` document, at any depth.

    `decoder_kind` ("root", "switch", "endpoint") says what a flat array of decoders holds, as
    the `-d root` filter does; without it the kind comes from wrapper keys or the fields printed.
    """
    listing = CxlListing()
    hint = f"decoder:{decoder_kind}" if decoder_kind else None
    for item in data:
        _walk(item, hint, None, listing)
    return listing


def _decoder_kind_from_parent(parent: str) -> str:
    if parent.startswith("root"):
        return "decoder:root"
    if parent.startswith("endpoint"):
        return "decoder:endpoint"
    return "decoder:switch"


def _hint_for_key(key: str) -> tuple[str | None, str | None]:
    """(kind hint, parent name) for a container key, or (None, None) for an ordinary field."""
    if key in _WRAPPER_KINDS:
        return _WRAPPER_KINDS[key], None
    if key == "memdev":
        return "memdev", None
    if ":" in key:
        prefix, parent = key.split(":", 1)
        kind = _CHILD_KINDS.get(prefix)
        if kind == "decoder":
            return _decoder_kind_from_parent(parent), parent
        if kind is not None:
            return kind, parent
    return None, None


def _walk(obj: Any, hint: str | None, parent: str | None, out: CxlListing) -> None:
    if isinstance(obj, list):
        for item in obj:
            _walk(item, hint, parent, out)
        return
    if not isinstance(obj, dict):
        return
    name = _add_object(obj, hint, parent, out)
    for key, value in obj.items():
        if not isinstance(value, list | dict):
            continue
        child_hint, child_parent = _hint_for_key(key)
        if child_hint is None:
            continue
        if key == "memdev" and isinstance(value, dict):
            # Under an endpoint the memdev is one object, not an array.
            _add_memdev(value, out, endpoint=name if name and name.startswith("endpoint") else None)
            continue
        _walk(value, child_hint, child_parent or name, out)


def _add_object(obj: dict[str, Any], hint: str | None, parent: str | None, out: CxlListing) -> str | None:
    if isinstance(obj.get("decoder"), str):
        out.decoders.append(_decoder_from_json(obj, hint, parent))
        return obj["decoder"]
    if isinstance(obj.get("memdev"), str):
        _add_memdev(obj, out)
        return obj["memdev"]
    if isinstance(obj.get("region"), str):
        region = _region_from_json(obj)
        if parent and parent.startswith("decoder"):
            region = dataclasses.replace(region, root_decoder=region.root_decoder or parent)
        out.regions.append(region)
        return region.name
    if isinstance(obj.get("endpoint"), str):
        out.ports.append(obj["endpoint"])
        return obj["endpoint"]
    if isinstance(obj.get("port"), str):
        out.ports.append(obj["port"])
        return obj["port"]
    if isinstance(obj.get("bus"), str):
        out.buses.append(obj["bus"])
        return obj["bus"]
    return None


def _add_memdev(obj: dict[str, Any], out: CxlListing, endpoint: str | None = None) -> None:
    name = as_str(obj.get("memdev"))
    if name is None:
        return
    host = as_str(obj.get("host"))
    numa = as_int(obj.get("numa_node"))
    out.memdevs.append(
        CxlMemdev(
            name=name,
            serial=as_hex(obj.get("serial")),
            host_bdf=host.lower() if host and BDF_RE.match(host) else None,
            # The tool omits a partition size that is zero.
            pmem_size=as_size(obj.get("pmem_size")) or 0,
            ram_size=as_size(obj.get("ram_size")) or 0,
            numa_node=numa if numa is not None and numa >= 0 else None,
            state="disabled" if obj.get("state") == "disabled" else "enabled",
            firmware_version=as_str(obj.get("firmware_version")),
            endpoint=endpoint,
        )
    )


def _decoder_from_json(obj: dict[str, Any], hint: str | None, parent: str | None) -> CxlDecoder:
    kind = hint.split(":", 1)[1] if hint and hint.startswith("decoder:") else None
    if kind is None:
        if any(k in obj for k in ("dpa_resource", "dpa_size", "mode")):
            kind = "endpoint"
        elif any(k in obj for k in ("pmem_capable", "volatile_capable", "max_available_extent", "accelmem_capable")):
            kind = "root"
    size = as_size(obj.get("size"))
    targets = obj.get("targets")
    target_list = (
        [str(t.get("target")) for t in targets if isinstance(t, dict) and t.get("target") is not None]
        if isinstance(targets, list)
        else []
    )
    return CxlDecoder(
        name=obj["decoder"],
        resource=as_hex(obj.get("resource")),
        size=size if size is not None else 0,
        interleave_ways=as_int(obj.get("interleave_ways")),
        interleave_granularity=as_int(obj.get("interleave_granularity")),
        # Capability flags are printed only when true.
        pmem_capable=bool(obj.get("pmem_capable")) if kind == "root" else as_bool(obj.get("pmem_capable")),
        volatile_capable=bool(obj.get("volatile_capable")) if kind == "root" else as_bool(obj.get("volatile_capable")),
        max_available_extent=as_size(obj.get("max_available_extent")),
        nr_targets=as_int(obj.get("nr_targets")),
        region=as_str(obj.get("region")),
        kind=kind,
        mode=as_str(obj.get("mode")) or ("none" if kind == "endpoint" else None),
        dpa_resource=as_hex(obj.get("dpa_resource")),
        dpa_size=as_size(obj.get("dpa_size")),
        state="disabled" if obj.get("state") == "disabled" else "enabled",
        target_list=target_list,
    )


def _region_from_json(obj: dict[str, Any]) -> CxlRegion:
    mappings = obj.get("mappings")
    ordered = (
        sorted((m for m in mappings if isinstance(m, dict)), key=lambda m: as_int(m.get("position")) or 0)
        if isinstance(mappings, list)
        else []
    )
    return CxlRegion(
        name=obj["region"],
        resource=as_hex(obj.get("resource")),
        size=as_size(obj.get("size")),
        type=as_str(obj.get("type")),
        interleave_ways=as_int(obj.get("interleave_ways")),
        interleave_granularity=as_int(obj.get("interleave_granularity")),
        decode_state=as_str(obj.get("decode_state")),
        memdevs=[str(m["memdev"]) for m in ordered if isinstance(m.get("memdev"), str)],
        state="disabled" if obj.get("state") == "disabled" else "enabled",
        endpoint_decoders=[str(m["decoder"]) for m in ordered if isinstance(m.get("decoder"), str)],
    )


# --- /sys/bus/cxl ---------------------------------------------------------------------------


def _node(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None


def _enabled(host: Host, base: str) -> str:
    # A device bound to its driver is enabled; `cxl disable-*` unbinds it.
    return "enabled" if host.readlink(f"{base}/driver") is not None else "disabled"


def read_cxl_sysfs(host: Host) -> CxlListing:
    listing = CxlListing()
    names = host.listdir(CXL_DEVICES)
    endpoint_memdev: dict[str, str] = {}
    endpoint_port: dict[str, str] = {}
    for name in names:
        base = f"{CXL_DEVICES}/{name}"
        if re.fullmatch(r"endpoint\d+", name):
            uport = host.resolve(f"{base}/uport")
            if uport:
                endpoint_memdev[name] = os.path.basename(uport)
            # An endpoint sits under the port (host bridge or switch) it is reached through.
            parent = os.path.basename(os.path.dirname(host.resolve(base) or ""))
            if re.fullmatch(r"port\d+", parent):
                endpoint_port[name] = parent
            listing.ports.append(name)
        elif re.fullmatch(r"port\d+", name):
            listing.ports.append(name)
        elif re.fullmatch(r"root\d+", name):
            listing.buses.append(name)
    memdev_endpoint = {mem: ep for ep, mem in endpoint_memdev.items()}
    for name in names:
        base = f"{CXL_DEVICES}/{name}"
        if re.fullmatch(r"mem\d+", name):
            endpoint = memdev_endpoint.get(name)
            memdev = _memdev_from_sysfs(host, name, base, endpoint)
            listing.memdevs.append(dataclasses.replace(memdev, port=endpoint_port.get(endpoint or "")))
        elif re.fullmatch(r"decoder\d+\.\d+", name):
            listing.decoders.append(_decoder_from_sysfs(host, name, base))
        elif re.fullmatch(r"region\d+", name):
            listing.regions.append(_region_from_sysfs(host, name, base, endpoint_memdev))
    # A decoder's region: the region's root decoder and its targets name them.
    by_decoder: dict[str, str] = {}
    for region in listing.regions:
        if region.root_decoder:
            by_decoder[region.root_decoder] = region.name
        for target in region.endpoint_decoders:
            by_decoder[target] = region.name
    listing.decoders = [dataclasses.replace(d, region=d.region or by_decoder.get(d.name)) for d in listing.decoders]
    return listing


def _memdev_from_sysfs(host: Host, name: str, base: str, endpoint: str | None) -> CxlMemdev:
    real = host.resolve(base)
    chain = pci_chain(real)
    return CxlMemdev(
        name=name,
        serial=host.read_int(f"{base}/serial"),
        host_bdf=chain[-1] if chain else None,
        pmem_size=host.read_int(f"{base}/pmem/size"),
        ram_size=host.read_int(f"{base}/ram/size"),
        numa_node=_node(host.read_int(f"{base}/numa_node", 10)),
        state=_enabled(host, base),
        firmware_version=host.read_str(f"{base}/firmware_version") or None,
        root_port=root_port_of(real),
        endpoint=endpoint,
        switch=switch_upstream_port_of(real),
    )


_DEVTYPE_KIND = {
    "cxl_decoder_root": "root",
    "cxl_decoder_switch": "switch",
    "cxl_decoder_endpoint": "endpoint",
}


def _decoder_from_sysfs(host: Host, name: str, base: str) -> CxlDecoder:
    kind = _DEVTYPE_KIND.get(host.read_str(f"{base}/devtype") or "")
    if kind is None:
        # Older kernels: where the decoder sits says what it is.
        parent = os.path.basename(os.path.dirname(host.resolve(base) or ""))
        kind = "root" if parent.startswith("root") else "endpoint" if parent.startswith("endpoint") else "switch"
    size = host.read_int(f"{base}/size")
    targets = host.read_str(f"{base}/target_list")
    locked = host.read_int(f"{base}/locked", 10)
    cap_pmem = host.read_int(f"{base}/cap_pmem", 10)
    cap_ram = host.read_int(f"{base}/cap_ram", 10)
    return CxlDecoder(
        name=name,
        resource=host.read_int(f"{base}/start") if size else None,
        size=size,
        interleave_ways=host.read_int(f"{base}/interleave_ways", 10),
        interleave_granularity=host.read_int(f"{base}/interleave_granularity", 10),
        pmem_capable=bool(cap_pmem) if cap_pmem is not None else None,
        volatile_capable=bool(cap_ram) if cap_ram is not None else None,
        nr_targets=len(targets.split(",")) if targets and kind != "endpoint" else None,
        kind=kind,
        mode=host.read_str(f"{base}/mode") if kind == "endpoint" else None,
        dpa_resource=host.read_int(f"{base}/dpa_resource") if kind == "endpoint" else None,
        dpa_size=host.read_int(f"{base}/dpa_size") if kind == "endpoint" else None,
        state=("disabled" if not size else "enabled") if size is not None else None,
        target_list=[t for t in (targets or "").split(",") if t],
        locked=bool(locked) if locked is not None else None,
    )


def _region_from_sysfs(host: Host, name: str, base: str, endpoint_memdev: dict[str, str]) -> CxlRegion:
    ways = host.read_int(f"{base}/interleave_ways", 10)
    targets = [host.read_str(f"{base}/target{i}") or "" for i in range(ways or 0)]
    targets = [t for t in targets if t]
    memdevs = [endpoint_memdev.get(_endpoint_of(t), "") for t in targets]
    commit = host.read_int(f"{base}/commit", 10)
    parent = os.path.basename(os.path.dirname(host.resolve(base) or ""))
    uuid = host.read_str(f"{base}/uuid")
    return CxlRegion(
        name=name,
        resource=host.read_int(f"{base}/resource"),
        size=host.read_int(f"{base}/size"),
        type=host.read_str(f"{base}/mode") or None,
        interleave_ways=ways,
        interleave_granularity=host.read_int(f"{base}/interleave_granularity", 10),
        decode_state=("commit" if commit else "reset") if commit is not None else None,
        memdevs=[m for m in memdevs if m] if all(memdevs) else [],
        state=_enabled(host, base),
        uuid=uuid or None,
        root_decoder=parent if parent.startswith("decoder") else None,
        endpoint_decoders=targets,
    )


def _endpoint_of(decoder: str) -> str:
    """decoder5.0 belongs to port id 5, i.e. endpoint5 when it is an endpoint decoder."""
    match = re.fullmatch(r"decoder(\d+)\.\d+", decoder)
    return f"endpoint{match.group(1)}" if match else ""


# --- merged ---------------------------------------------------------------------------------


def _fill(primary: T, secondary: T | None) -> T:
    """`primary` with every unknown (None or empty list) field taken from `secondary`."""
    if secondary is None:
        return primary
    updates = {}
    for f in dataclasses.fields(primary):  # type: ignore[arg-type]
        value = getattr(primary, f.name)
        if value is None or value == []:
            other = getattr(secondary, f.name)
            if other is not None and other != []:
                updates[f.name] = other
    return dataclasses.replace(primary, **updates) if updates else primary  # type: ignore[type-var]


def _merge(primary: list[T], secondary: list[T]) -> list[T]:
    by_name = {getattr(s, "name"): s for s in secondary}  # noqa: B009 - generic over dataclasses
    seen = set()
    merged = []
    for item in primary:
        name = getattr(item, "name")  # noqa: B009
        seen.add(name)
        merged.append(_fill(item, by_name.get(name)))
    merged.extend(s for s in secondary if getattr(s, "name") not in seen)  # noqa: B009
    return sorted(merged, key=lambda x: _natural(getattr(x, "name")))  # noqa: B009


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def read_cxl(host: Host, problems: list[str]) -> CxlState:
    bus_present = host.is_dir("/sys/bus/cxl")
    sysfs = read_cxl_sysfs(host) if bus_present else CxlListing()
    listing = CxlListing()
    listed = False
    for argv in OBJECT_LISTINGS:
        data = run_json(host, argv, problems)
        if data is None:
            continue
        listed = True
        # `-d root` / `-d endpoint` print a flat array: the filter says what the decoders are.
        part = parse_cxl_list(data, argv[argv.index("-d") + 1] if "-d" in argv else None)
        listing.memdevs += part.memdevs
        listing.decoders += part.decoders
        listing.regions += part.regions
        listing.buses += part.buses
        listing.ports += part.ports
    decoders = _merge(listing.decoders, sysfs.decoders)
    regions = [_region_type(r, decoders) for r in _merge(_dedupe(listing.regions), sysfs.regions)]
    memdevs = _merge(_dedupe(listing.memdevs), sysfs.memdevs)
    if listed:
        memdevs, regions = _with_health(host, problems, memdevs, regions)
    sources = [s for s, used in (("cxl list", listed), ("sysfs", bus_present)) if used]
    return CxlState(
        bus_present=bus_present,
        memdevs=memdevs,
        root_decoders=[d for d in decoders if d.kind == "root"],
        switch_decoders=[d for d in decoders if d.kind == "switch"],
        endpoint_decoders=[d for d in decoders if d.kind == "endpoint"],
        regions=regions,
        buses=sorted(set(listing.buses) | set(sysfs.buses), key=_natural),
        ports=sorted(set(listing.ports) | set(sysfs.ports), key=_natural),
        source="+".join(sources) or None,
    )


def _with_health(
    host: Host, problems: list[str], memdevs: list[CxlMemdev], regions: list[CxlRegion]
) -> tuple[list[CxlMemdev], list[CxlRegion]]:
    """Memdevs with their health and regions with their poison lists, where `cxl` reported them.

    sysfs holds neither (both come from mailbox commands), so without `cxl` they stay None."""
    health = read_health(host, problems)
    media = read_media_errors(host, problems)
    memdevs = [dataclasses.replace(m, health=health[m.name]) if m.name in health else m for m in memdevs]
    if media is not None:
        regions = [dataclasses.replace(r, media_errors=media[r.name]) if r.name in media else r for r in regions]
    return memdevs, regions


def _region_type(region: CxlRegion, decoders: list[CxlDecoder]) -> CxlRegion:
    """ndctl < 77 prints no region type and kernels < 6.3 have no region/mode: the endpoint
    decoders' DPA mode (pmem or ram) says the same thing."""
    if region.type is not None:
        return region
    modes = {d.mode for d in decoders if d.name in region.endpoint_decoders}
    if len(modes) == 1 and modes <= {"pmem", "ram"}:
        return dataclasses.replace(region, type=modes.pop())
    return region


def _dedupe(items: list[T]) -> list[T]:
    """The same object listed twice (e.g. a memdev under its endpoint and at top level): keep one, merged."""
    out: dict[str, T] = {}
    for item in items:
        name = getattr(item, "name")  # noqa: B009
        out[name] = _fill(out[name], item) if name in out else item
    return list(out.values())
