"""Finding the pool's objects among a host's facts: its memdevs, CXL region, namespace and dax device.

Several topics need them (the region, devdax, permissions, header, DDIO and MTRR topics), and so
does `belugactl rack`'s probe; they only read facts, never plan.
"""

from __future__ import annotations

from belugactl.host.snapshot import CxlRegion, DaxDevice, NdNamespace
from belugactl.workflows.memdev_choice import MemdevWant, choose_memdevs, placed_facts
from belugactl.workflows.memdev_choice import natural_key as natural_key  # re-exported: region.py sorts names
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget


def pool_memdevs(target: SetupTarget, facts: SetupFacts) -> list[str]:
    """The names of the memdevs the pool's region is built from, in interleave-position order.

    Raises MemdevSelectionError (exit 2) when the manifest's selection cannot be met here.
    """
    pool = target.pool
    want = MemdevWant(serials=pool.memdev_serials, switch=pool.memdev_switch, count=pool.memdev_count)
    cxl = facts.snapshot.cxl
    return [m.name for m in choose_memdevs(cxl.memdevs, want, pool.region_type, placed=placed_facts(cxl))]


def find_pool_region(target: SetupTarget, facts: SetupFacts) -> CxlRegion | None:
    if target.pool.source != "cxl-region":
        return None
    memdevs = set(pool_memdevs(target, facts))
    created = facts.state.get("created", {}).get("region")
    for region in facts.snapshot.cxl.regions:
        if memdevs and set(region.memdevs) == memdevs:
            return region
    # Older tool versions may not list mappings; the region setup created is then known by name.
    return facts.snapshot.cxl.region(created) if created else None


def find_pool_namespace(target: SetupTarget, facts: SetupFacts) -> NdNamespace | None:
    uuid = (target.pool.namespace_uuid or "").lower()
    if not uuid:
        return None
    spaces = facts.snapshot.nd.namespaces
    # The label uuid is the one `create-namespace -u` pinned (discovery reads it from sysfs); ndctl's
    # "uuid" for a devdax namespace is the info block's, so it matches only raw namespaces.
    by_label = [n for n in spaces if n.label_uuid == uuid or (n.uuid or "").lower() == uuid]
    if by_label:
        return by_label[0]
    # Without the label uuid (no sysfs access), the pinned name identifies it.
    return next(
        (n for n in spaces if n.label_uuid is None and n.name and n.name == target.pool.namespace_name),
        None,
    )


def pool_dax_device(target: SetupTarget, facts: SetupFacts) -> str | None:
    """The pool's dax device name ("dax0.0") once it exists."""
    if target.pool.source == "dax-device":
        return target.pool.dax_device if facts.snapshot.dax_device(target.pool.dax_device or "") else None
    if target.pool.region_type == "pmem":
        ns = find_pool_namespace(target, facts)
        return ns.chardev if ns is not None and ns.mode == "devdax" else None
    region = find_pool_region(target, facts)
    if region is None:
        return None
    # A ram region's dax region carries the region's number (dax_region id == region id).
    number = region.name.removeprefix("region")
    found = [d for d in facts.snapshot.dax if d.name.startswith(f"dax{number}.")]
    return found[0].name if found else None


def dax_usable(dax: DaxDevice) -> bool:
    """A devdax device with a driver: its /dev node can be mapped.

    A new ram region's dax device is driverless until `daxctl reconfigure-device --mode=devdax` binds
    device_dax (daxctl 81 lists it as mode devdax, state disabled); its /dev node may already exist
    but opening it fails with ENXIO (seen in the ram lab, kernel 6.12).
    """
    return dax.mode != "system-ram" and dax.state != "disabled"


def pool_dax_usable(target: SetupTarget, facts: SetupFacts) -> str | None:
    """The pool's dax device name once it can be mapped (bound to device_dax)."""
    dax = pool_dax(target, facts)
    return dax.name if dax is not None and dax_usable(dax) else None


def pool_dax(target: SetupTarget, facts: SetupFacts) -> DaxDevice | None:
    name = pool_dax_device(target, facts)
    return facts.snapshot.dax_device(name) if name else None


def nd_region_for(region: CxlRegion, facts: SetupFacts) -> str | None:
    """The libnvdimm region a CXL pmem region appears as (separate id spaces: match by size)."""
    candidates = [r for r in facts.snapshot.nd.regions if (r.provider or "CXL") == "CXL"]
    sized = [r for r in candidates if region.size is not None and r.size == region.size]
    pick = sized or (candidates if len(candidates) == 1 else [])
    return pick[0].dev if len(pick) == 1 else None

