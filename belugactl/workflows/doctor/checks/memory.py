"""Host memory tuning: the hotplug auto-online policy, hugepages per node, THP."""

from __future__ import annotations

from belugactl.units import format_size
from belugactl.workflows.doctor.checks.common import NO_CXL
from belugactl.workflows.doctor.context import DoctorContext, HugepageWant
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult

AUTO_ONLINE = "/sys/devices/system/memory/auto_online_blocks"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


# Guards data: onlined as system RAM, the pool's memory is the kernel's to hand out and zero.
@REGISTRY.check("memory.auto-online", "hot-added memory is not onlined as RAM automatically", guards_data=True)
def auto_online(ctx: DoctorContext) -> CheckResult:
    policy = ctx.snapshot.memory.auto_online_blocks
    if policy is None:
        return CheckResult.skip(f"{AUTO_ONLINE} not readable (kernel without memory hotplug)")
    if not policy.startswith("online"):
        return CheckResult.ok(f"auto_online_blocks is {policy}", policy=policy)
    if not ctx.has_cxl and ctx.expect is None:
        return CheckResult.skip(f"{NO_CXL}; policy is {policy}, which matters only once CXL memory appears")
    return CheckResult.fail(
        f"auto_online_blocks is {policy}: memory handed to the kernel (a CXL ram region, a dax device given to kmem) "
        "is onlined as system RAM at once, which claims and zeroes the shared pool",
        f"echo offline > {AUTO_ONLINE}; persist it with memhp_default_state=offline on the kernel command line "
        "(a kernel built with CONFIG_MHP_DEFAULT_ONLINE_TYPE overrides the default)",
        policy=policy,
    )


def _wants(ctx: DoctorContext) -> tuple[HugepageWant, ...]:
    return ctx.expect.hugepages if ctx.expect is not None else ()


@REGISTRY.check("hugepages.per-node", "hugepages reserved per NUMA node as the manifest asks")
def hugepages_per_node(ctx: DoctorContext) -> CheckResult:
    wants = _wants(ctx)
    snap = ctx.snapshot
    if not wants:
        current = ", ".join(
            f"node {n.id}: "
            + ", ".join(f"{c.total or 0} x {format_size(size)}" for size, c in sorted(n.hugepages.items()))
            for n in snap.numa
            if n.hugepages
        )
        return CheckResult.skip("no hugepages asked for by a manifest" + (f" (now {current})" if current else ""))
    short, extra, missing_nodes = [], [], []
    fixes: list[str] = []
    for want in wants:
        node = snap.numa_node(want.node)
        if node is None:
            missing_nodes.append(want.node)
            continue
        have = node.hugepages.get(want.page_size)
        total = have.total if have is not None and have.total is not None else 0
        label = f"node {want.node}: {total}/{want.count} x {format_size(want.page_size)}"
        if total < want.count:
            short.append(label)
            path = (
                f"/sys/devices/system/node/node{want.node}/hugepages/hugepages-{want.page_size // 1024}kB/nr_hugepages"
            )
            fixes.append(f"echo {want.count} > {path}")
        elif total > want.count:
            extra.append(label)
    from belugactl.workflows.doctor.checks.numa import discovered_cxl_nodes

    on_cxl = sorted({w.node for w in wants} & set(discovered_cxl_nodes(ctx))) if ctx.has_cxl else []
    if on_cxl:
        return CheckResult.fail(
            f"the manifest reserves hugepages on node(s) {', '.join(map(str, on_cxl))}, which is the CXL memory "
            "here: a CXL node's number is assigned at boot and can change, so it must be discovered, never pinned",
            "list only CPU nodes in tuning.hugepages.per_node (`numactl --hardware`; the CXL node is CPU-less)",
            cxl_nodes=on_cxl,
        )
    if missing_nodes:
        nodes = ", ".join(str(n.id) for n in snap.numa) or "none"
        return CheckResult.fail(
            f"the manifest reserves hugepages on NUMA node(s) {', '.join(map(str, missing_nodes))}, "
            f"which this host does not have (nodes: {nodes})",
            "correct tuning.hugepages.per_node (node numbers are per host; check `numactl --hardware`)",
        )
    if short:
        gig = any(w.page_size >= 1 << 30 for w in wants)
        tail = "; then read it back (the kernel may allocate fewer)"
        if gig:
            tail += "; 1 GiB pages usually need boot-time reservation: hugepagesz=1G hugepages=N"
        return CheckResult.fail("too few hugepages: " + "; ".join(short), "; ".join(fixes) + tail)
    if extra:
        return CheckResult.warn(
            "more hugepages than the manifest asks (memory held back from everything else): " + "; ".join(extra),
            "lower them with the same sysfs files, or raise tuning.hugepages.per_node",
        )
    return CheckResult.ok("hugepages as the manifest asks: " + ", ".join(f"node {w.node}: {w.count}" for w in wants))


def _thp_fix(mode: str) -> str:
    return (
        f"echo {mode} > {THP_ENABLED}; persist with transparent_hugepage={mode} on the kernel command line; "
        "restart vLLM workers (the change affects new mappings only)"
    )


@REGISTRY.check("thp.mode", "transparent hugepages in the mode the manifest asks (never: off)")
def thp_mode(ctx: DoctorContext) -> CheckResult:
    mode = ctx.snapshot.thp.enabled
    if mode is None:
        return CheckResult.skip(f"{THP_ENABLED} not readable (kernel without THP)")
    want = ctx.expect.thp if ctx.expect is not None else None
    if want is not None:
        if mode != want:
            return CheckResult.fail(f"THP is {mode}, the manifest asks for {want}", _thp_fix(want))
        return CheckResult.ok(f"THP is {mode}, as the manifest asks")
    if mode == "never":
        return CheckResult.warn("THP is never: the KV cache's host buffers get 4 KiB pages only", _thp_fix("madvise"))
    return CheckResult.ok(f"THP is {mode}")
