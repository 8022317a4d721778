"""DDIO on the PCIe root ports above the pool's CXL adapters and the GPUs (Intel only).

The bits and which CPUs document them are in model/ddio.py, shared with doctor's `ddio.disabled`
check, so both say the same thing where setup leaves DDIO to the BIOS. Teardown puts back exactly
the bits setup changed, from the values it saved before its first write.
"""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem
from belugactl.host.snapshot import RootPort
from belugactl.model.ddio import (
    NOSNOOP_OP_WR_EN,
    PERFCTRLSTS_0,
    PERFCTRLSTS_1_BYTE1,
    TPHDIS,
    USE_ALLOCATING_FLOW_WR,
    os_toggle,
)
from belugactl.model.setup_plan import PciConfigRmw, Skip, Step
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.pool_lookup import pool_memdevs
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State

ID = "ddio"


def ddio_state(pcs0: int, pcs1: int) -> str:
    """'disabled' only when all three bits say so (rpma semantics); 'enabled' otherwise."""
    off = not pcs0 & USE_ALLOCATING_FLOW_WR and not pcs0 & NOSNOOP_OP_WR_EN and pcs1 & TPHDIS
    return "disabled" if off else "enabled"


def wanted_changes(pcs0: int, pcs1: int, want: str) -> list[tuple[int, int, int, int]]:
    """(offset, clear_bits, set_bits, current) for each byte that must change to reach `want`."""
    if want == "disabled":
        plan = [
            (PERFCTRLSTS_0, USE_ALLOCATING_FLOW_WR | NOSNOOP_OP_WR_EN, 0, pcs0),
            (PERFCTRLSTS_1_BYTE1, 0, TPHDIS, pcs1),
        ]
    else:  # enabled: back to the hardware defaults of the bits we manage
        plan = [(PERFCTRLSTS_0, 0, USE_ALLOCATING_FLOW_WR, pcs0), (PERFCTRLSTS_1_BYTE1, TPHDIS, 0, pcs1)]
    return [(off, clear, set_, cur) for off, clear, set_, cur in plan if ((cur & ~clear & 0xFF) | set_) != cur]


def pool_root_ports(target: SetupTarget, facts: SetupFacts) -> list[str]:
    snap = facts.snapshot
    ports: list[str] = []
    names = set(pool_memdevs(target, facts)) if target.pool.source == "cxl-region" else None
    for memdev in snap.cxl.memdevs:
        if (names is None or memdev.name in names) and memdev.root_port:
            ports.append(memdev.root_port)
    ports += [d.root_port for d in snap.cxl_adapters if d.root_port]
    ports += [g.root_port for g in snap.gpus if g.root_port]
    return sorted(set(ports))


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    if target.ddio == "unmanaged":
        return Planned(skipped=[Skip(ID, "caching.ddio is unmanaged")])
    cpu = facts.snapshot.cpu
    if cpu.vendor != "GenuineIntel":
        return Planned(skipped=[Skip(ID, f"DDIO is an Intel feature; this CPU is {cpu.vendor or 'unknown'}")])
    layout, not_here = os_toggle(cpu.family, cpu.model)
    if layout is None or not_here is not None:
        return Planned(skipped=[Skip(ID, not_here or "")])
    ports = pool_root_ports(target, facts)
    if not ports:
        return Planned(skipped=[Skip(ID, "no root port above the pool's CXL adapters or the GPUs was found")])
    steps: list[Step] = []
    for bdf in ports:
        rp: RootPort | None = facts.snapshot.root_port(bdf)
        if rp is None or rp.perfctrlsts_0 is None or rp.perfctrlsts_1 is None:
            raise EnvironmentProblem(
                f"cannot read the DDIO registers of root port {bdf}",
                why="config bytes 0x180/0x185 were not readable (needs root and the extended config space)",
                fix="run as root; `setpci -s BDF 180.b` should print a byte",
            )
        if rp.vendor is not None and rp.vendor != 0x8086:
            continue  # not an Intel root port: its 0x180 means something else
        changes = wanted_changes(rp.perfctrlsts_0, rp.perfctrlsts_1, target.ddio)
        if not changes:
            continue
        lockdown = facts.snapshot.kernel.lockdown
        if lockdown and lockdown != "none":
            raise EnvironmentProblem(
                f"DDIO on {bdf} needs a PCI config-space write, which kernel lockdown ({lockdown}) forbids",
                why="under lockdown the kernel refuses config-space writes from user space",
                fix="set DDIO in the BIOS (IIO configuration), or boot without lockdown",
            )
        actions = tuple(PciConfigRmw(bdf, off, clear, set_, cur) for off, clear, set_, cur in changes)
        steps.append(
            Step(
                id=f"ddio.{bdf}",
                topic=ID,
                summary=f"DDIO {target.ddio} on root port {bdf} ({layout.name})",
                actions=actions,
                before=f"{ddio_state(rp.perfctrlsts_0, rp.perfctrlsts_1)} "
                f"(0x180=0x{rp.perfctrlsts_0:02x}, 0x185=0x{rp.perfctrlsts_1:02x})",
                after=target.ddio,
                subject=bdf,
            )
        )
    return Planned(steps=steps)


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    """Put back the managed bits setup saved; bits others changed since are left as they are."""
    out = Planned()
    for bdf, saved in sorted(facts.state.get("previous", {}).get("ddio", {}).items()):
        rp = facts.snapshot.root_port(bdf)
        if rp is None or rp.perfctrlsts_0 is None or rp.perfctrlsts_1 is None:
            out.notes.append(f"root port {bdf}: DDIO registers unreadable, left as they are")
            continue
        actions = []
        for offset, mask, current in (
            (PERFCTRLSTS_0, USE_ALLOCATING_FLOW_WR | NOSNOOP_OP_WR_EN, rp.perfctrlsts_0),
            (PERFCTRLSTS_1_BYTE1, TPHDIS, rp.perfctrlsts_1),
        ):
            old = int(saved[f"{offset:#x}"])
            if (current & mask) != (old & mask):
                actions.append(PciConfigRmw(bdf, offset, mask & ~old, mask & old, current))
        if actions:
            out.steps.append(
                Step(
                    id=f"ddio.{bdf}",
                    topic=ID,
                    summary=f"restore the DDIO bits of root port {bdf}",
                    actions=tuple(actions),
                    before=f"0x180=0x{rp.perfctrlsts_0:02x}, 0x185=0x{rp.perfctrlsts_1:02x}",
                    after="as before setup",
                    subject=bdf,
                )
            )
    return out


def discovery(target: SetupTarget, state: State) -> frozenset[str]:
    # The PCI walk (root ports) only when DDIO is managed or has bits to restore.
    saved = bool(state.get("previous", {}).get("ddio"))
    managed = getattr(target, "ddio", "unmanaged") != "unmanaged"
    return frozenset({"pci"}) if managed or saved else frozenset()


def remember(step: Step, facts: SetupFacts, state: State) -> None:
    for action in step.actions:
        if isinstance(action, PciConfigRmw):
            saved = state.setdefault("previous", {}).setdefault("ddio", {}).setdefault(action.bdf, {})
            saved.setdefault(f"{action.offset:#x}", action.expect)


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    if verb == "teardown":
        state.get("previous", {}).get("ddio", {}).pop(step.subject, None)


TOPIC = SetupTopic(
    id=ID,
    order=70,
    summary="DDIO on the root ports above the pool's CXL adapters and the GPUs (Intel)",
    plan=plan,
    teardown=teardown,
    discovery=discovery,
    remember=remember,
    record=record,
    changes=frozenset({"pci"}),
)
