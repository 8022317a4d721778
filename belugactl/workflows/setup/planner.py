"""Facts + target -> Plan, for setup (make the host match) and teardown (undo what setup made).

Topics are planned in dependency order; a topic whose object does not exist yet (the header of a
dax device not yet created) contributes a deferred step, and the applier plans again after each
step, so every command it runs is computed from the host as it is at that moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from belugactl.host.write_sysfs import THP_ENABLED, node_hugepages_path
from belugactl.host.write_udev import RULE_FILE
from belugactl.model.plan import PciConfigRmw, Plan, RemoveFile, RunCommand, Skip, Step, WriteAttr
from belugactl.workflows.setup import steps_ddio, steps_header, steps_mtrr, steps_pool, steps_tuning
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import ALL_TOPICS, SetupTarget

TopicPlanner = Callable[[SetupTarget, SetupFacts, bool], tuple[list[Step], list[Skip]]]

TOPICS: dict[str, TopicPlanner] = {
    "region": steps_pool.plan_region,
    "devdax": steps_pool.plan_devdax,
    "permissions": steps_pool.plan_permissions,
    "header": steps_header.plan_header,
    "hugepages": steps_tuning.plan_hugepages,
    "thp": steps_tuning.plan_thp,
    "ddio": steps_ddio.plan_ddio,
    "mtrr": steps_mtrr.plan_mtrr,
}
assert tuple(TOPICS) == ALL_TOPICS


def plan_setup(
    target: SetupTarget, facts: SetupFacts, *, force: bool = False, only: Iterable[str] | None = None
) -> Plan:
    chosen = set(only) if only else set(TOPICS)
    plan = Plan(host=target.host, verb="setup")
    for name, planner in TOPICS.items():
        if name not in chosen:
            continue
        steps, skipped = planner(target, facts, force)
        plan.steps.extend(steps)
        plan.skipped.extend(skipped)
    return plan


def plan_teardown(target: SetupTarget, facts: SetupFacts, *, force: bool = False) -> Plan:
    """Reverse what the state file says setup made, newest first. Nothing else is touched."""
    plan = Plan(host=target.host, verb="teardown")
    state = facts.state
    previous = state.get("previous", {})
    created = state.get("created", {})
    snap = facts.snapshot
    plan.steps.extend(steps_mtrr.plan_mtrr_teardown(facts))
    for bdf, saved in sorted(previous.get("ddio", {}).items()):
        rp = snap.root_port(bdf)
        if rp is None or rp.perfctrlsts_0 is None or rp.perfctrlsts_1 is None:
            plan.notes.append(f"root port {bdf}: DDIO registers unreadable, left as they are")
            continue
        actions = []
        for offset, mask, current in (
            (steps_ddio.PERFCTRLSTS_0, steps_ddio.USE_ALLOCATING_FLOW_WR | steps_ddio.NOSNOOP_OP_WR_EN,
             rp.perfctrlsts_0),
            (steps_ddio.PERFCTRLSTS_1_BYTE1, steps_ddio.TPHDIS, rp.perfctrlsts_1),
        ):
            old = int(saved[f"{offset:#x}"])
            if (current & mask) != (old & mask):
                actions.append(PciConfigRmw(bdf, offset, mask & ~old, mask & old, current))
        if actions:
            plan.steps.append(
                Step(
                    id=f"ddio.{bdf}",
                    topic="ddio",
                    summary=f"restore the DDIO bits of root port {bdf}",
                    actions=tuple(actions),
                    before=f"0x180=0x{rp.perfctrlsts_0:02x}, 0x185=0x{rp.perfctrlsts_1:02x}",
                    after="as before setup",
                )
            )
    if "thp" in previous and snap.thp.enabled not in (None, previous["thp"]):
        plan.steps.append(
            Step(
                id="thp.enabled",
                topic="thp",
                summary=f"transparent hugepages back to {previous['thp']}",
                actions=(WriteAttr(THP_ENABLED, previous["thp"]),),
                before=snap.thp.enabled,
                after=previous["thp"],
            )
        )
    size = int(previous.get("hugepage_size", target.hugepage_size))
    for node_key, count in sorted(previous.get("hugepages", {}).items()):
        node = snap.numa_node(int(node_key))
        have = node.hugepages.get(size).total if node is not None and node.hugepages.get(size) else None
        if have is not None and have != count:
            plan.steps.append(
                Step(
                    id=f"hugepages.node{node_key}",
                    topic="hugepages",
                    summary=f"hugepages on NUMA node {node_key} back to {count}",
                    actions=(WriteAttr(node_hugepages_path(int(node_key), size), str(count)),),
                    before=f"{have} pages",
                    after=f"{count} pages",
                )
            )
    if created.get("udev_rule") and facts.udev_rule is not None:
        plan.steps.append(
            Step(
                id="permissions.dax",
                topic="permissions",
                summary="remove belugactl's udev rule for the pool device",
                actions=(RemoveFile(RULE_FILE),),
                note="the device node keeps its current owner until it is next created",
            )
        )
    namespace = created.get("namespace")
    if namespace and any(n.dev == namespace for n in snap.nd.namespaces):
        plan.steps.append(
            Step(
                id="devdax.destroy",
                topic="devdax",
                summary=f"destroy namespace {namespace} (the pool's devdax device on this host)",
                actions=(RunCommand(("ndctl", "destroy-namespace", "-f", namespace)),),
                destroys_data=True,
                note="this host loses the pool and what it holds; other hosts keep their own namespaces",
            )
        )
    region = created.get("region")
    if region and snap.cxl.region(region) is not None:
        plan.steps.append(
            Step(
                id="region.destroy",
                topic="region",
                summary=f"destroy CXL region {region}",
                actions=(RunCommand(("cxl", "destroy-region", "-f", region)),),
                destroys_data=True,
                note="the pool content is unreachable from this host afterwards",
            )
        )
    if state.get("header"):
        plan.notes.append("the pool header stays: other hosts may still use the pool")
    return plan
