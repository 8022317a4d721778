"""NUMA: where the CXL memory is (discovered, never assumed) and that its node has no CPUs."""

from __future__ import annotations

from belugactl.workflows.doctor.checks.common import skip_without_cxl
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult


def discovered_cxl_nodes(ctx: DoctorContext) -> dict[int, list[str]]:
    """Node id -> where it was discovered (dax target_node, CXL nd region target_node, CPU-less memory node)."""
    found: dict[int, list[str]] = {}
    for dev in ctx.cxl_dax_devices():
        if dev.target_node is not None:
            found.setdefault(dev.target_node, []).append(f"{dev.name} target_node")
    for region in ctx.snapshot.nd.regions:
        if (region.provider or "").upper() == "CXL" and region.target_node is not None:
            found.setdefault(region.target_node, []).append(f"nd {region.dev} target_node")
    if not found:
        for node in ctx.cxl_nodes():
            found.setdefault(node.id, []).append("CPU-less node with memory")
    return found


@REGISTRY.check("numa.cxl-node-discovered", "the CXL memory's NUMA node is discovered")
def cxl_node_discovered(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    found = discovered_cxl_nodes(ctx)
    if not found:
        if not ctx.cxl_dax_devices():
            return CheckResult.skip("no dax device on CXL memory yet, so no node to discover (see dax.device-present)")
        return CheckResult.warn(
            "CXL memory present but no NUMA node could be attributed to it",
            "look at `daxctl list` (target_node) and `numactl --hardware`; "
            "bind by the discovered node, never a fixed number",
        )
    text = "; ".join(f"node {n} ({', '.join(src)})" for n, src in sorted(found.items()))
    online = [n for n in sorted(found) if _has_memory(ctx, n)]
    want = ctx.expect.cxl_nodes if ctx.expect is not None else None
    details = {"nodes": sorted(found), "online_memory_nodes": online}
    if want is not None and want != len(online):
        return CheckResult.warn(
            f"{len(online)} CXL node(s) hold online memory ({text}); the manifest's host expects {want}",
            "correct hosts[].numa.cxl_nodes, or check that every adapter's memory is set up as intended",
            **details,
        )
    return CheckResult.ok(
        f"CXL memory is {text}; discovered at run time, the number can change across boots", **details
    )


def _has_memory(ctx: DoctorContext, node_id: int) -> bool:
    node = ctx.snapshot.numa_node(node_id)
    if node is None:
        return False
    if node.has_memory is not None:
        return node.has_memory
    return bool(node.mem_total)


@REGISTRY.check("numa.cxl-node-cpuless", "the CXL NUMA node has no CPUs")
def cxl_node_cpuless(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    if ctx.expect is not None and not ctx.expect.cxl_node_cpuless:
        return CheckResult.skip("the manifest allows CPUs on the CXL node (hosts[].numa.cxl_node_cpuless: false)")
    found = discovered_cxl_nodes(ctx)
    if not found:
        return CheckResult.skip("no CXL node discovered (see numa.cxl-node-discovered)")
    with_cpus = []
    offline = []
    for node_id in sorted(found):
        node = ctx.snapshot.numa_node(node_id)
        if node is None:
            offline.append(node_id)
        elif node.cpus:
            with_cpus.append((node_id, node.cpus))
    if with_cpus:
        described = "; ".join(f"node {n} has CPUs {_cpulist(c)}" for n, c in with_cpus)
        return CheckResult.fail(
            f"{described}: CXL memory shares a node with CPUs, so `numactl --membind` and the kernel's local-first "
            "allocation put ordinary allocations on the pool's node",
            "check the firmware's SRAT/HMAT (CXL windows should get their own proximity domain, e.g. a BIOS "
            "'CXL as separate NUMA node' option); if this is intended, set hosts[].numa.cxl_node_cpuless: false",
            nodes=[n for n, _ in with_cpus],
        )
    note = (
        f" (node {', '.join(map(str, offline))} not online: devdax keeps the pool out of the page allocator)"
        if offline
        else ""
    )
    return CheckResult.ok(f"CXL node(s) {', '.join(map(str, sorted(found)))} have no CPUs{note}")


def _cpulist(cpus: list[int]) -> str:
    """0-3,8 style, as the kernel prints it."""
    out: list[str] = []
    start = prev = None
    for cpu in sorted(cpus):
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:  # type: ignore[operator]
            prev = cpu
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = cpu
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(out)
