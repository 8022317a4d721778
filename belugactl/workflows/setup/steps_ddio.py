"""DDIO on the PCIe root ports above the pool's CXL adapters and the GPUs (Intel only).

Register semantics follow Intel's rpma `tools/ddio.sh`: in perfctrlsts_0 (config 0x180) bit 7 is
use_allocating_flow_wr and bit 3 NoSnoopOpWrEn; in perfctrlsts_1 (byte 0x185) bit 0 is TPHDIS.
Allocating writes into the LLC are off only when bit 7 = 0, bit 3 = 0 and TPHDIS = 1. The offsets
are documented for Skylake-SP and Cascade Lake (both CPU model 0x55); Intel's own tooling says Ice
Lake needs the BIOS, and no public reference covers later parts, so those are skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from belugactl.errors import EnvironmentProblem
from belugactl.host.snapshot import RootPort
from belugactl.model.plan import PciConfigRmw, Skip, Step
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.steps_pool import pool_memdevs
from belugactl.workflows.setup.target import SetupTarget

PERFCTRLSTS_0 = 0x180
PERFCTRLSTS_1_BYTE1 = 0x185
USE_ALLOCATING_FLOW_WR = 0x80  # bit 7 of 0x180
NOSNOOP_OP_WR_EN = 0x08  # bit 3 of 0x180
TPHDIS = 0x01  # bit 0 of 0x185 (bit 8 of perfctrlsts_1)


@dataclass(frozen=True)
class DdioLayout:
    name: str
    supported: bool
    reason: str = ""


# Intel family 6 model numbers (arch/x86/include/asm/intel-family.h).
LAYOUTS: dict[int, DdioLayout] = {
    0x55: DdioLayout("Skylake-SP / Cascade Lake", True),
    0x6A: DdioLayout("Ice Lake-SP", False, "Intel's rpma tooling: Ice Lake DDIO cannot be toggled from the OS"),
    0x6C: DdioLayout("Ice Lake-D", False, "Intel's rpma tooling: Ice Lake DDIO cannot be toggled from the OS"),
    0x8F: DdioLayout("Sapphire Rapids", False, "no public reference for the DDIO bits on this CPU"),
    0xCF: DdioLayout("Emerald Rapids", False, "no public reference for the DDIO bits on this CPU"),
    0xAD: DdioLayout("Granite Rapids", False, "no public reference for the DDIO bits on this CPU"),
}


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


def plan_ddio(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    if target.ddio == "unmanaged":
        return [], [Skip("ddio", "caching.ddio is unmanaged")]
    cpu = facts.snapshot.cpu
    if cpu.vendor != "GenuineIntel":
        return [], [Skip("ddio", f"DDIO is an Intel feature; this CPU is {cpu.vendor or 'unknown'}")]
    layout = LAYOUTS.get(cpu.model or -1) if cpu.family == 6 else None
    if layout is None:
        model = f"family {cpu.family} model {cpu.model:#x}" if cpu.model is not None else "an unknown model"
        return [], [Skip("ddio", f"no documented DDIO register layout for {model}; set DDIO in the BIOS")]
    if not layout.supported:
        return [], [Skip("ddio", f"{layout.name}: {layout.reason}; set DDIO in the BIOS")]
    ports = pool_root_ports(target, facts)
    if not ports:
        return [], [Skip("ddio", "no root port above the pool's CXL adapters or the GPUs was found")]
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
                topic="ddio",
                summary=f"DDIO {target.ddio} on root port {bdf} ({layout.name})",
                actions=actions,
                before=f"{ddio_state(rp.perfctrlsts_0, rp.perfctrlsts_1)} "
                f"(0x180=0x{rp.perfctrlsts_0:02x}, 0x185=0x{rp.perfctrlsts_1:02x})",
                after=target.ddio,
            )
        )
    return steps, []
