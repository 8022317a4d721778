"""Hugepages per NUMA node: a kernel setting a reboot resets, and that may silently fall short."""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.write_sysfs import node_hugepages_path
from belugactl.model.setup_plan import Skip, Step, WriteAttr
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State

ID = "hugepages"


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    if not target.hugepages:
        return Planned(skipped=[Skip(ID, "the manifest asks for no hugepages")])
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
                topic=ID,
                summary=f"{count} x {format_size(size)} hugepages on NUMA node {node_id}",
                actions=(WriteAttr(node_hugepages_path(node_id, size), str(count)),),
                before=f"{have if have is not None else 'unknown'} pages",
                after=f"{count} pages",
                subject=(node_id, size),
            )
        )
    return Planned(steps=steps)


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    previous = facts.state.get("previous", {})
    size = int(previous.get("hugepage_size", target.hugepage_size))
    steps = []
    for node_key, count in sorted(previous.get("hugepages", {}).items()):
        node = facts.snapshot.numa_node(int(node_key))
        have = node.hugepages.get(size).total if node is not None and node.hugepages.get(size) else None
        if have is not None and have != count:
            steps.append(
                Step(
                    id=f"hugepages.node{node_key}",
                    topic=ID,
                    summary=f"hugepages on NUMA node {node_key} back to {count}",
                    actions=(WriteAttr(node_hugepages_path(int(node_key), size), str(count)),),
                    before=f"{have} pages",
                    after=f"{count} pages",
                    subject=(int(node_key), size),
                )
            )
    return Planned(steps=steps)


def check_write(action: WriteAttr, back: str | None) -> str:
    """The kernel reserves what free memory allows, silently: compare what it reports."""
    got = int(back) if back and back.strip().isdigit() else None
    if got != int(action.value):
        raise StepFailed(
            f"asked the kernel for {action.value} hugepages, it reserved {got if got is not None else '?'}",
            why=f"{action.path}: the NUMA node has too little free contiguous memory",
            fix="free memory on that node (stop services, `echo 1 > /proc/sys/vm/compact_memory`), "
            "or reserve hugepages at boot (kernel parameter hugepages=)",
        )
    return f"{action.path} = {got}"


def remember(step: Step, facts: SetupFacts, state: State) -> None:
    """The node's page count before the first setup changed it, for teardown."""
    node_id, size = step.subject
    node = facts.snapshot.numa_node(node_id)
    count = node.hugepages.get(size) if node is not None else None
    if count is not None and count.total is not None:
        previous = state.setdefault("previous", {})
        previous.setdefault("hugepages", {}).setdefault(str(node_id), count.total)
        previous.setdefault("hugepage_size", size)


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    if verb == "teardown":
        node_id, _ = step.subject
        state.get("previous", {}).get("hugepages", {}).pop(str(node_id), None)


TOPIC = SetupTopic(
    id=ID,
    order=50,
    summary="hugepages per NUMA node",
    plan=plan,
    teardown=teardown,
    check_write=check_write,
    remember=remember,
    record=record,
    changes=frozenset({"hugepages", "numa"}),
)
