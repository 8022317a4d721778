"""What the manifest wants of one host, flattened to what setup needs (SetupTarget).

The manifest schema belongs to the model layer; this module is the one adapter between it and
setup, so a schema change touches only `target_from_manifest`. It imports nothing of setup: the
topics (workflows/setup/topics/) import it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.pool import header as hdr
from belugactl.units import MiB
from belugactl.workflows.memdev_choice import MemdevWant

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext


@dataclass(frozen=True)
class PoolTarget:
    source: str  # "cxl-region" | "dax-device"
    size: int  # usable bytes (the dax device)
    align: int = 2 * MiB
    region_type: str = "pmem"  # "pmem" | "ram"
    memdev_serials: tuple[str, ...] | None = None  # None: not chosen by serial (all, or switch/count)
    memdev_switch: str | None = None  # the switch's upstream port ("0000:0d:00.0") or "any"
    memdev_count: int | None = None  # the first N by serial
    decoder: str | None = None  # root decoder pinned by the manifest
    region_size: int | None = None
    ways: int = 1
    granularity: int | None = None
    interleave_mode: str = "hardware"
    dax_device: str | None = None  # dax-device source: "dax0.0"
    namespace_uuid: str | None = None
    namespace_name: str | None = None


@dataclass(frozen=True)
class DevicePermissions:
    owner: str = "root"
    group: str = "root"
    mode: int = 0o660


@dataclass(frozen=True)
class HeaderSpec:
    """The header this host's manifest implies, and how much of the pool to map to see it."""

    ours: hdr.PoolHeader
    map_size: int = hdr.HEADER_REGION
    layout: Any = None  # the PoolLayout behind `ours`: a capacity layout's slots name a membership change


def header_spec_for(manifest: Any, layout: Any, host_name: str) -> HeaderSpec:
    return HeaderSpec(ours=hdr.PoolHeader.from_layout(manifest, layout, created_by=host_name), layout=layout)


@dataclass(frozen=True)
class SecretTarget:
    """The rack secret setup's `secret` topic keeps (docs/dataplane.md, Authentication)."""

    path: str
    owner: str  # who runs the metadata server: the pool's owner
    server_host: str | None  # the metadata server's host: the only one that gets a secret
    rack: str


def secret_target(manifest: Any) -> SecretTarget | None:
    """Where the rack secret lives, when the manifest opens an endpoint beyond loopback (else None:
    nothing needs one, and setup makes none)."""
    from belugactl.dataplane.rpc.auth import is_loopback, secret_path

    serve = manifest.serve
    if serve is None or (is_loopback(serve.metadata.rpc_bind) and is_loopback(serve.metadata.admin_bind)):
        return None
    server = serve.metadata.host
    if server is None:
        meta = manifest.metadata_host()
        server = meta.name if meta is not None else None
    return SecretTarget(secret_path(manifest), manifest.pool.permissions.owner, server, manifest.name)


@dataclass(frozen=True)
class SetupTarget:
    host: str
    pool: PoolTarget
    permissions: DevicePermissions = DevicePermissions()
    hugepage_size: int = 2 * MiB
    hugepages: dict[int, int] = field(default_factory=dict)  # NUMA node -> page count
    thp: str | None = None  # None: leave as is
    ddio: str = "unmanaged"  # "disabled" | "enabled" | "unmanaged"
    uncachable: bool = False
    header: HeaderSpec | None = None  # None: leave the header alone
    # A memory-type split: the KV area's pieces in pool offsets (PoolLayout.uncachable_spans); None: no split
    uncachable_spans: tuple[tuple[int, int], ...] | None = None
    secret: SecretTarget | None = None  # None: no rack secret wanted (every endpoint on loopback)


def default_host_name(manifest: Any) -> str:
    """The manifest host that is this machine, by the one rule (`model/host_select.py:select_host`)."""
    from belugactl.model.host_select import select_host

    return select_host(manifest, None, socket.gethostname()).name


def target_from_context(rack: RackContext) -> SetupTarget:
    """What setup wants of this machine's entry in the rack context (layout resolved once there)."""
    return target_from_manifest(rack.manifest, rack.host_name, layout=rack.layout)



def target_from_manifest(manifest: Any, host_name: str | None = None, *, layout: Any = None) -> SetupTarget:
    from belugactl.model.host_select import select_host

    host = select_host(manifest, host_name, None if host_name else socket.gethostname())
    name = host.name
    pool = manifest.pool
    src = pool.source
    ns = pool.namespace
    if src.kind == "cxl-region":
        want = MemdevWant.from_manifest(src.memdevs)
        pool_target = PoolTarget(
            source="cxl-region",
            size=pool.size,
            align=pool.align,
            region_type=src.type,
            memdev_serials=want.serials,
            memdev_switch=want.switch,
            memdev_count=want.count,
            decoder=src.decoder,
            region_size=src.region_size,
            ways=pool.interleave.ways,
            granularity=pool.interleave.granularity,
            interleave_mode=pool.interleave.mode,
            namespace_uuid=ns.uuid if ns else None,
            namespace_name=ns.name if ns else None,
        )
    else:
        pool_target = PoolTarget(source="dax-device", size=pool.size, align=pool.align, dax_device=src.device)
    # A host's own tuning overrides the rack's field by field: a host that only sets THP keeps the rack's hugepages.
    own = host.tuning
    hp = own.hugepages if own is not None and own.hugepages is not None else manifest.tuning.hugepages
    thp = own.thp if own is not None and own.thp is not None else manifest.tuning.thp
    perms = pool.permissions  # pool.permissions: defaults root/root/0660 when the manifest has none
    permissions = DevicePermissions(owner=perms.owner, group=perms.group, mode=int(str(perms.mode), 8))
    header = header_spec_for(manifest, layout, name) if layout is not None else None
    return SetupTarget(
        host=name,
        pool=pool_target,
        permissions=permissions,
        hugepage_size=hp.page_size if hp else 2 * MiB,
        hugepages=dict(hp.per_node) if hp else {},
        thp=thp,
        ddio=manifest.caching.ddio,
        uncachable=manifest.caching.pool_memory_type == "uncachable",
        header=header,
        secret=secret_target(manifest),
        uncachable_spans=layout.uncachable_spans if layout is not None else None,
    )
