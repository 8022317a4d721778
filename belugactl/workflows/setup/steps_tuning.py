"""Hugepages per NUMA node and the THP mode: kernel settings that a reboot resets."""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem
from belugactl.host.write_sysfs import THP_ENABLED, node_hugepages_path
from belugactl.model.plan import Skip, Step, WriteAttr
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget


def plan_hugepages(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    if not target.hugepages:
        return [], [Skip("hugepages", "the manifest asks for no hugepages")]
    size = target.hugepage_size
    steps = []
    for node_id, count in sorted(target.hugepages.items()):
        node = facts.snapshot.numa_node(node_id)
        if node is None:
            known = ", ".join(str(n.id) for n in facts.snapshot.numa) or "none"
            raise EnvironmentProblem(
                f"the manifest asks for hugepages on NUMA node {node_id}, which this host does not have",
                why=f"NUMA nodes present: {known}",
                fix="correct tuning.hugepages.per_node (NUMA numbers can change across reboots: check numactl -H)",
            )
        current = node.hugepages.get(size)
        have = current.total if current is not None else None
        if have == count:
            continue
        steps.append(
            Step(
                id=f"hugepages.node{node_id}",
                topic="hugepages",
                summary=f"{count} x {format_size(size)} hugepages on NUMA node {node_id}",
                actions=(WriteAttr(node_hugepages_path(node_id, size), str(count)),),
                before=f"{have if have is not None else 'unknown'} pages",
                after=f"{count} pages",
            )
        )
    return steps, []


def plan_thp(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    if target.thp is None:
        return [], [Skip("thp", "the manifest leaves THP as it is")]
    current = facts.snapshot.thp.enabled
    if current == target.thp:
        return [], []
    return [
        Step(
            id="thp.enabled",
            topic="thp",
            summary=f"transparent hugepages: {target.thp}",
            actions=(WriteAttr(THP_ENABLED, target.thp),),
            before=current or "unknown",
            after=target.thp,
            note="affects processes started afterwards: restart vLLM workers",
        )
    ], []
