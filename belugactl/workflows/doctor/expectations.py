"""From a validated manifest and a host name to the plain `Expectations` the checks read."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from belugactl.model.host_select import select_host
from belugactl.workflows.doctor.context import Expectations, HugepageWant
from belugactl.workflows.memdev_choice import MemdevWant

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Host, Manifest
    from belugactl.workflows.rack_context import RackContext


def pick_host(manifest: Manifest, wanted: str | None, hostname: str | None, *, file: str = "the manifest") -> Host:
    """The manifest's entry for `--host`, else the one matching this machine's hostname (one rule for all)."""
    return select_host(manifest, wanted, hostname, file=file)


def from_context(rack: RackContext, host: Host) -> Expectations:
    """Expectations from a rack context: its layout is resolved once, there."""
    return replace(from_manifest(rack.manifest, host, layout=rack.layout_or_none()), manifest_file=rack.file)


def _serials(selection: Any) -> tuple[int, ...]:
    if selection == "all" or not isinstance(selection, list):
        return ()
    out = []
    for raw in selection:
        try:
            out.append(int(str(raw), 0))
        except ValueError:
            continue  # the schema accepted it as an opaque string; the memdev check cannot compare it
    return tuple(out)


_RESOLVE = object()  # from_manifest's default: resolve the layout here (callers without a context)


def from_manifest(manifest: Manifest, host: Host, *, layout: Any = _RESOLVE) -> Expectations:
    pool = manifest.pool
    source = pool.source
    is_region = getattr(source, "kind", None) == "cxl-region"
    tuning = manifest.tuning_for(host)
    hugepages: tuple[HugepageWant, ...] = ()
    if tuning.hugepages is not None:
        hugepages = tuple(
            HugepageWant(node, tuning.hugepages.page_size, count)
            for node, count in sorted(tuning.hugepages.per_node.items())
        )
    if layout is _RESOLVE:
        from belugactl.workflows.rack_context import RackContext

        layout = RackContext(manifest).layout_or_none()
    namespace = pool.namespace
    selection = getattr(source, "memdevs", "all") if is_region else "all"
    want = MemdevWant.from_manifest(selection)
    return Expectations(
        host_name=host.name,
        pool_size=pool.size,
        region_size=getattr(source, "region_size", None) if is_region else None,
        align=pool.align,
        dax_device=None if is_region else getattr(source, "device", None),
        source="region" if is_region else "dax",
        region_type=getattr(source, "type", None) if is_region else None,
        namespace_uuid=namespace.uuid if namespace is not None else None,
        namespace_name=namespace.name if namespace is not None else None,
        # Setup reads ways 1 (the default) as "across every selected memdev", however many that is
        # (topics/region.py): only a written count above 1 is a number doctor can hold a region to.
        interleave_ways=(
            pool.interleave.ways if pool.interleave.mode == "hardware" and pool.interleave.ways > 1 else None
        ),
        memdev_serials=_serials(selection),
        memdev_switch=want.switch,
        memdev_count=want.count,
        hosts_sharing=len(manifest.hosts),
        hugepages=hugepages,
        thp=tuning.thp,
        ddio=manifest.caching.ddio,
        pool_memory=manifest.caching.pool_memory_type,
        cxl_node_cpuless=host.numa.cxl_node_cpuless,
        cxl_nodes=host.numa.cxl_nodes,
        gpus=host.gpus.count,
        dev_owner=pool.permissions.owner,
        dev_group=pool.permissions.group,
        dev_mode=int(pool.permissions.mode, 8),
        layout=layout,
        manifest=manifest,
        entry=host,
    )
