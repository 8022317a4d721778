"""Where the pool's bytes and copies go: software interleave zones against the devices, GPU to
CXL adapter NUMA locality, and Intel DSA copy engines (issue 33 item 6)."""

from __future__ import annotations

from collections import defaultdict

from belugactl.host.snapshot import CxlRegion
from belugactl.units import format_size
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity

# Intel DSA (drivers/dma/idxd: PCI_DEVICE_ID_INTEL_DSA_SPR0, _GNRD, _DMR); read_pci names them "dsa".
DSA_DOC = "docs/measurements.md, figures quoted from the seeds"


# --- software interleave ------------------------------------------------------------------------


def zone_devices(layout: object, ways: int, granularity: int, device_size: int) -> list[tuple[int, int, set[int]]]:
    """(zone start, zone size, devices it touches) for the allocator's zones over the shared KV area,
    with the devices laid end to end in the pool, `device_size` bytes each (model/layout.py Stripes)."""
    from belugactl.dataplane.mds.allocator import Allocator

    kv = layout.shared_kv  # type: ignore[attr-defined]
    allocator = Allocator(kv.offset, kv.size, ways=ways, granularity=granularity)
    out = []
    for start, size in allocator.zone_ranges():
        devices = set(range(start // device_size, (start + size - 1) // device_size + 1)) if size else set()
        out.append((start, size, devices))
    return out


def _device_regions(ctx: DoctorContext, ways: int, device_size: int) -> tuple[list[str], str | None]:
    """The memdev behind each device slice of the pool, from the x1 CXL regions its range spans;
    ([], why) when discovery cannot tell."""
    dax = ctx.pool_dax()
    if dax is None or dax.resource is None:
        return [], "the pool's dax device or its physical address is not known"
    regions: list[CxlRegion] = [r for r in ctx.snapshot.cxl.regions if r.resource is not None and r.size]
    if not regions:
        return [], "no CXL region describes the pool's range (firmware-provisioned): device order not checked"
    names: list[str] = []
    for k in range(ways):
        lo = dax.resource + k * device_size
        hits = [r for r in regions if r.resource <= lo < r.resource + r.size]  # type: ignore[operator]
        if len(hits) != 1 or len(hits[0].memdevs) != 1:
            shown = ", ".join(f"{r.name} x{r.interleave_ways or '?'}" for r in hits) or "no region"
            return [], f"device slice {k} (0x{lo:x}) lies in {shown}, not in one single-device region"
        names.append(hits[0].memdevs[0])
    return names, None


@REGISTRY.check(
    "pool.interleave-zones", "software interleave's zones each lie on their own memory device", Severity.WARNING
)
def interleave_zones(ctx: DoctorContext) -> CheckResult:
    exp = ctx.expect
    if exp is None or exp.manifest is None or exp.layout is None:
        return CheckResult.skip("no manifest: no software interleave to check")
    from belugactl.model.layout import software_stripes

    stripes = software_stripes(exp.manifest)
    if stripes is None or stripes.ways < 2:
        return CheckResult.skip("the manifest asks for no software interleave (hardware, or one way)")
    zones = zone_devices(exp.layout, stripes.ways, stripes.granularity, stripes.device_size)
    problems: list[str] = []
    if len(zones) < stripes.ways:
        problems.append(f"the shared KV area holds {len(zones)} zone(s) for {stripes.ways} ways")
    straddling = [z for z, (_, _, devs) in enumerate(zones) if len(devs) > 1]
    if straddling:
        first = zones[straddling[0]]
        problems.append(
            f"{len(straddling)} of {len(zones)} zones span two devices (zone {straddling[0]} at pool offset "
            f"0x{first[0]:x} covers devices {', '.join(map(str, sorted(first[2])))}): the shared KV area does not "
            f"start on a device boundary ({format_size(stripes.device_size)} each)"
        )
    owners: dict[int, list[int]] = defaultdict(list)
    for z, (_, _, devs) in enumerate(zones):
        owners[min(devs, default=-1)].append(z)
    shared = {d: zs for d, zs in owners.items() if len(zs) > 1}
    if shared:
        d, zs = next(iter(sorted(shared.items())))
        problems.append(f"zones {', '.join(map(str, zs))} start on the same device {d}")
    details: dict[str, object] = {
        "ways": stripes.ways,
        "device_size": stripes.device_size,
        "zones": [{"offset": s, "size": n, "devices": sorted(d)} for s, n, d in zones],
    }
    memdevs, why = _device_regions(ctx, stripes.ways, stripes.device_size)
    if memdevs:
        details["memdevs"] = memdevs
        if len(set(memdevs)) != len(memdevs):
            problems.append(f"the device slices map to memdevs {', '.join(memdevs)}: one device twice")
    fix = (
        "make every zone one device: zones follow the shared KV area, devices follow the pool; size the areas "
        "before it (header, metadata, journal) and the partitions so that the KV area starts and ends on device "
        f"boundaries ({format_size(stripes.device_size)}), or use hardware interleave (`cxl create-region -w`)"
    )
    if problems:
        return CheckResult.warn("; ".join(problems), fix, **details)
    where = f", memdevs in zone order: {', '.join(memdevs)}" if memdevs else f" ({why})"
    return CheckResult.ok(f"{len(zones)} zones, one per device{where}", **details)


# --- GPU to adapter locality ------------------------------------------------------------------


@REGISTRY.check(
    "pci.cxl-adapter-locality", "every GPU has a CXL adapter on its NUMA node (adapters per socket)", Severity.WARNING
)
def adapter_locality(ctx: DoctorContext) -> CheckResult:
    snap = ctx.snapshot
    gpus, adapters = snap.gpus, snap.cxl_adapters
    if not gpus or not adapters:
        return CheckResult.skip(f"{len(gpus)} GPU(s) and {len(adapters)} CXL adapter(s): no pairs to place")
    per_node: dict[int, list[str]] = defaultdict(list)
    for a in adapters:
        if a.numa_node is not None:
            per_node[a.numa_node].append(a.bdf)
    unknown = [d.bdf for d in [*gpus, *adapters] if d.numa_node is None]
    details: dict[str, object] = {
        "adapters_per_node": {str(n): bdfs for n, bdfs in sorted(per_node.items())},
        "sockets": snap.cpu.sockets,
    }
    if unknown:
        return CheckResult.skip(
            f"NUMA node unknown for {', '.join(unknown)} (see gpu.numa-locality): locality not known", **details
        )
    remote = [g for g in gpus if g.numa_node not in per_node]
    summary = ", ".join(f"node {n}: {len(b)} adapter(s)" for n, b in sorted(per_node.items()))
    if remote:
        nodes = sorted({g.numa_node for g in remote})  # type: ignore[type-var]
        return CheckResult.warn(
            f"{len(remote)} GPU(s) on node(s) {', '.join(map(str, nodes))} have no CXL adapter there ({summary}): "
            "their pool transfers cross the socket interconnect",
            "put one CXL adapter on each socket that has GPUs (Beluga: one x16 adapter per socket), or run the "
            "workers of those GPUs where the pool is local",
            remote_gpus=[g.bdf for g in remote],
            **details,
        )
    sockets = f" on {snap.cpu.sockets} socket(s)" if snap.cpu.sockets else ""
    return CheckResult.ok(f"every GPU has an adapter on its node{sockets} ({summary})", **details)


# --- Intel DSA --------------------------------------------------------------------------------


@REGISTRY.check(
    "pci.dsa-engines", "Intel DSA copy engines (an option for pool copies of 4 KB and up)", Severity.WARNING
)
def dsa_engines(ctx: DoctorContext) -> CheckResult:
    dsa = [d for d in ctx.snapshot.pci if d.kind == "dsa"]
    if not dsa:
        return CheckResult.skip("no Intel DSA device on the PCI bus")
    unbound = [d.bdf for d in dsa if d.driver != "idxd"]
    bound = len(dsa) - len(unbound)
    note = f"; not bound to idxd: {', '.join(unbound)} (`modprobe idxd`)" if unbound else ""
    # Information only: belugactl's copies do not use DSA yet; the figures are in the docs.
    return CheckResult.ok(
        f"{len(dsa)} Intel DSA device(s), {bound} bound to idxd: a copy engine for transfers of 4 KB and up, "
        f"which belugactl does not use yet (see {DSA_DOC}){note}",
        dsa={d.bdf: {"numa_node": d.numa_node, "driver": d.driver} for d in dsa},
    )
