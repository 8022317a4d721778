"""DDIO register facts shared by `doctor` (which reads them) and `setup` (which writes them).

Register semantics follow Intel's rpma `tools/ddio.sh` (reference/ops-cli.md 1.1): in perfctrlsts_0
(config 0x180) bit 7 is use_allocating_flow_wr and bit 3 NoSnoopOpWrEn; in perfctrlsts_1 (byte
0x185) bit 0 is TPHDIS. Allocating writes into the LLC are off only when bit 7 = 0, bit 3 = 0 and
TPHDIS = 1. The offsets are documented for Skylake-SP and Cascade Lake (both CPU model 0x55);
Intel's own tooling says Ice Lake needs the BIOS, and no public reference covers later parts.
One table says which CPUs setup writes the bits on, so doctor's fix and setup's skip agree.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def os_toggle(family: int | None, model: int | None) -> tuple[DdioLayout | None, str | None]:
    """(the documented layout, None) where setup writes the bits; (layout or None, why not) elsewhere.

    The reason ends with what to do instead, in the words both `setup` (a skip) and `doctor` (a fix) print.
    """
    layout = LAYOUTS.get(model if model is not None else -1) if family == 6 else None
    if layout is None:
        name = f"family {family} model {model:#x}" if model is not None else "an unknown model"
        return None, f"no documented DDIO register layout for {name}; set DDIO in the BIOS"
    if not layout.supported:
        return layout, f"{layout.name}: {layout.reason}; set DDIO in the BIOS"
    return layout, None
