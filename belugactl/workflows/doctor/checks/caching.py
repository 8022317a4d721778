"""Caching in front of the pool: DDIO on the root ports (Intel) and uncachable MTRRs over the pool,
or with a memory-type split over its shared KV area only (the header, rings and journal write-back).

DDIO register semantics follow Intel's pmem/rpma tools/ddio.sh (reference/ops-cli.md 1.1): in
perfctrlsts_0 (config 0x180) bit 7 is use_allocating_flow_wr and bit 3 NoSnoopOpWrEn; in the byte
at 0x185 bit 0 is TPHDIS. Allocating flows (DDIO) are fully off only when bit 7 = 0, bit 3 = 0
and TPHDIS = 1; bit 7 is the primary indicator, so bit 7 set is a failure and a partial state a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from belugactl.host.snapshot import RootPort
from belugactl.model.ddio import os_toggle
from belugactl.units import format_size
from belugactl.workflows.doctor.checks.common import NO_CXL, manifest_arg, skip_without_cxl
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity

INTEL_VENDOR = 0x8086
USE_ALLOCATING_FLOW_WR = 0x80  # perfctrlsts_0 bit 7
NOSNOOP_OP_WR_EN = 0x08  # perfctrlsts_0 bit 3
TPHDIS = 0x01  # bit 0 of the byte at 0x185


@dataclass(frozen=True)
class PortDdio:
    bdf: str
    p0: int | None
    p1: int | None

    @property
    def readable(self) -> bool:
        return self.p0 is not None

    @property
    def allocating(self) -> bool:
        return self.p0 is not None and bool(self.p0 & USE_ALLOCATING_FLOW_WR)

    @property
    def fully_off(self) -> bool:
        return (
            self.p0 is not None
            and not self.p0 & (USE_ALLOCATING_FLOW_WR | NOSNOOP_OP_WR_EN)
            and self.p1 is not None
            and bool(self.p1 & TPHDIS)
        )

    def describe(self) -> str:
        p0 = f"0x{self.p0:02x}" if self.p0 is not None else "?"
        p1 = f"0x{self.p1:02x}" if self.p1 is not None else "?"
        return f"{self.bdf} (0x180={p0}, 0x185={p1})"


def _managed_ports(ctx: DoctorContext) -> list[RootPort]:
    """Root ports in front of the GPUs and CXL adapters: DDIO on these is what matters here."""
    snap = ctx.snapshot
    wanted = {d.root_port for d in snap.pci if d.kind in ("gpu", "cxl") and d.root_port}
    wanted |= {m.root_port for m in snap.cxl.memdevs if m.root_port}
    devices = {d.bdf for d in snap.pci if d.kind in ("gpu", "cxl")}
    ports = [p for p in snap.root_ports if p.bdf in wanted or devices.intersection(p.devices)]
    return sorted(ports, key=lambda p: p.bdf)


def _desired(ctx: DoctorContext) -> str:
    # Without a manifest, doctor holds the host to Beluga's guideline: DDIO off in front of GPUs and adapters.
    return ctx.expect.ddio if ctx.expect is not None and ctx.expect.ddio else "disabled"


def ddio_problem_ports(ctx: DoctorContext) -> list[str]:
    """Root ports whose DDIO state differs from what is wanted (empty when not applicable)."""
    if not ctx.is_intel or _desired(ctx) == "unmanaged" or skip_without_cxl(ctx) is not None:
        return []
    want_off = _desired(ctx) == "disabled"
    states = [
        PortDdio(p.bdf, p.perfctrlsts_0, p.perfctrlsts_1)
        for p in _managed_ports(ctx)
        if p.vendor in (None, INTEL_VENDOR)
    ]
    # Disabling also means NoSnoopOpWrEn clear and TPHDIS set, so a partial state still needs writes.
    return [s.bdf for s in states if s.readable and ((not s.fully_off) if want_off else not s.allocating)]


def _ddio_fix(ctx: DoctorContext, ports: list[PortDdio], *, want_off: bool) -> str:
    cmds = []
    for port in ports:
        if want_off:
            cmds.append(f"setpci -s {port.bdf} 180.b=00:88")  # value:mask clears bits 7 and 3 only
            cmds.append(f"setpci -s {port.bdf} 185.b=01:01")  # sets TPHDIS only
        else:
            cmds.append(f"setpci -s {port.bdf} 180.b=80:80")
    text = "; ".join(cmds)
    cpu = ctx.snapshot.cpu
    _, bios_only = os_toggle(cpu.family, cpu.model)
    if bios_only is not None:
        # Setup's own skip reason (model/ddio.py), so both say the same; the bits are not documented here.
        return (f"{bios_only} (IIO configuration); `belugactl setup` skips DDIO on this CPU. "
                f"Unverified on this CPU (the Skylake-SP/Cascade Lake bits; read them back after): {text}")
    if ctx.snapshot.kernel.lockdown not in (None, "none"):
        text = "kernel lockdown blocks these writes, use the BIOS IIO setting instead; otherwise: " + text
    return text + f"; or `belugactl setup -f {manifest_arg(ctx)}` (plans the same read-modify-write)"


@REGISTRY.check("ddio.disabled", "DDIO off on the root ports of GPUs and CXL adapters (Intel)")
def ddio_disabled(ctx: DoctorContext) -> CheckResult:
    cpu = ctx.snapshot.cpu
    if cpu.vendor is None:
        return CheckResult.skip("CPU vendor unknown; DDIO exists on Intel Xeon only")
    if not ctx.is_intel:
        return CheckResult.skip(f"not applicable on {cpu.vendor}: DDIO is an Intel Xeon feature")
    if not ctx.has_cxl and ctx.expect is None:
        return CheckResult.skip(NO_CXL + ": DDIO in front of the GPUs matters only for their traffic to the pool")
    desired = _desired(ctx)
    if desired == "unmanaged":
        return CheckResult.skip("the manifest leaves DDIO unmanaged (caching.ddio: unmanaged)")
    ports = _managed_ports(ctx)
    if not ports:
        return CheckResult.skip("no root port found in front of a GPU or CXL adapter (see pci.root-ports-found)")
    foreign = [p.bdf for p in ports if p.vendor is not None and p.vendor != INTEL_VENDOR]
    states = [PortDdio(p.bdf, p.perfctrlsts_0, p.perfctrlsts_1) for p in ports if p.bdf not in foreign]
    unreadable = [s for s in states if not s.readable]
    readable = [s for s in states if s.readable]
    why = "" if ctx.expect is not None else " (no manifest: Beluga's guideline, DDIO off, is assumed)"
    details: dict[str, object] = {
        "ports": {s.bdf: {"perfctrlsts_0": s.p0, "perfctrlsts_1": s.p1} for s in states},
        "desired": desired,
    }
    if desired == "disabled":
        on = [s for s in readable if s.allocating]
        if on:
            return CheckResult.fail(
                f"DDIO is on (use_allocating_flow_wr set) at {', '.join(s.describe() for s in on)}{why}",
                _ddio_fix(ctx, on, want_off=True),
                **details,
            )
        partial = [s for s in readable if not s.fully_off]
        if partial:
            return CheckResult.warn(
                "allocating writes off, but NoSnoopOpWrEn set or TPHDIS clear at "
                f"{', '.join(s.describe() for s in partial)}: TPH-tagged writes may still allocate in the LLC",
                _ddio_fix(ctx, partial, want_off=True),
                **details,
            )
    else:
        off = [s for s in readable if not s.allocating]
        if off:
            return CheckResult.fail(
                f"the manifest wants DDIO enabled, but it is off at {', '.join(s.describe() for s in off)}",
                _ddio_fix(ctx, off, want_off=False),
                **details,
            )
    short_config = [p.bdf for p in ports if p.config_size is not None and p.config_size < 4096]
    if unreadable and short_config:
        return CheckResult.warn(
            f"only the first {min(p.config_size or 0 for p in ports if p.bdf in short_config)} bytes of config space "
            f"are visible at {', '.join(short_config)}: no extended config space (ECAM/MMCONFIG), "
            "so 0x180 is out of reach",
            "enable MMCONFIG/ECAM (BIOS, or drop pci=nommconf from the kernel command line), or set DDIO in the BIOS",
            **details,
        )
    if unreadable:
        return CheckResult.warn(
            f"cannot read config offset 0x180 of {', '.join(s.bdf for s in unreadable)} "
            "(needs root and extended config space)",
            "run doctor as root (`sudo belugactl doctor ...`); "
            "`/sys/bus/pci/devices/BDF/config` must be 4096 bytes (ECAM)",
            **details,
        )
    return CheckResult.ok(
        f"DDIO {desired} on {len(readable)} root port(s): {', '.join(s.bdf for s in readable)}", **details
    )


def _variable_mtrrs(ctx: DoctorContext) -> int | None:
    """The CPU's variable MTRR count (IA32_MTRRCAP), when the msr driver lets us read it."""
    if ctx.host is None:
        return None
    try:
        from belugactl.host.write_mtrr import variable_mtrr_count

        return variable_mtrr_count(ctx.host)
    except (ImportError, OSError):
        return None


def _pool_range(ctx: DoctorContext) -> tuple[int, int] | None:
    """The pool's physical range (base, size): its dax device, else its CXL region."""
    dax = ctx.pool_dax()
    if dax is not None and dax.resource is not None and dax.size:
        return dax.resource, dax.size
    regions = [r for r in ctx.snapshot.cxl.regions if r.resource is not None and r.size]
    if len(regions) == 1:
        return regions[0].resource, regions[0].size  # type: ignore[return-value]
    return None


def uncovered(base: int, size: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [base, base+size) outside every (base, size) in `covered`."""
    gaps = [(base, base + size)]
    for c_base, c_size in covered:
        c_end = c_base + c_size
        nxt = []
        for start, end in gaps:
            if c_end <= start or c_base >= end:
                nxt.append((start, end))
                continue
            if start < c_base:
                nxt.append((start, c_base))
            if c_end < end:
                nxt.append((c_end, end))
        gaps = nxt
    return [(s, e - s) for s, e in gaps]


def mtrr_pieces(base: int, size: int) -> list[tuple[int, int]]:
    """Split a range into power-of-two sized, size-aligned pieces (what one variable MTRR can hold)."""
    pieces = []
    start, end = base, base + size
    while start < end:
        piece = start & -start if start else 1 << (end - 1).bit_length()
        while start + piece > end:
            piece >>= 1
        pieces.append((start, piece))
        start += piece
    return pieces


@REGISTRY.check("mtrr.pool-uncachable", "pool memory uncachable (MTRR) when the manifest asks for it")
def mtrr_pool_uncachable(ctx: DoctorContext) -> CheckResult:
    if ctx.expect is None:
        return CheckResult.skip("no manifest: whether the pool must be uncachable is the manifest's choice")
    if _split_layout(ctx) is not None:
        return CheckResult.skip("the manifest gives the KV area its own memory type: see mtrr.kv-uncachable")
    if ctx.expect.pool_memory != "uncachable":
        return CheckResult.skip(
            f"the manifest keeps pool memory {ctx.expect.pool_memory or 'write-back'} (caching.pool_memory_type)"
        )
    span = _pool_range(ctx)
    if span is None:
        return CheckResult.skip("the pool's physical range is not known yet (no dax device or region): needs setup")
    base, size = span
    mtrr = ctx.snapshot.mtrr
    if mtrr is None:
        return CheckResult.fail(
            "/proc/mtrr is absent: this kernel or CPU offers no MTRRs, so the pool cannot be made uncachable",
            "set caching.pool_memory_type: write-back in the manifest (the data plane then flushes and uses "
            "non-temporal stores), or run on a host with MTRR support",
        )
    uc = [(e.base, e.size) for e in mtrr if e.type == "uncachable"]
    gaps = uncovered(base, size, uc)
    details = {"pool_base": base, "pool_size": size, "gaps": [{"base": b, "size": s} for b, s in gaps]}
    if not gaps:
        return CheckResult.ok(f"pool 0x{base:x}+{format_size(size)} is covered by uncachable MTRRs", **details)
    lines = [
        f'echo "base=0x{b:x} size=0x{s:x} type=uncachable" > /proc/mtrr'
        for g_b, g_s in gaps
        for b, s in mtrr_pieces(g_b, g_s)
    ]
    missing = sum(s for _, s in gaps)
    total = _variable_mtrrs(ctx)
    if total is not None and len(lines) > total - len(mtrr):
        details["variable_mtrrs"] = total
        return CheckResult.fail(
            f"{format_size(missing)} of the pool (0x{base:x}+{format_size(size)}) is not uncachable, and covering it "
            f"takes {len(lines)} MTRR(s) while only {max(total - len(mtrr), 0)} of {total} are free",
            "size and place the pool as one power of two aligned to its size (one MTRR covers it), free firmware "
            "entries you do not need (`cat /proc/mtrr`), or set caching.pool_memory_type: write-back",
            **details,
        )
    return CheckResult.fail(
        f"{format_size(missing)} of the pool (0x{base:x}+{format_size(size)}) is not uncachable; "
        f"{len(lines)} MTRR(s) needed",
        "as root: " + "; ".join(lines) + " (lost at reboot; `belugactl setup` re-applies it)",
        **details,
    )


# --- memory types by area (caching.memory_types: seeds): the KV area uncachable, the rest write-back ---------
# The seeds' figures (Beluga, SIGMOD 2026): 16 KB CPU write 2.41 us with non-temporal stores vs 281.56 us
# as stores to uncachable memory; 16 KB read 5.98 us after CLFLUSH vs 166.49 us uncachable.
POLL_FIX = (
    "keep the header, rings and journal write-back: set caching.memory_types: seeds (the KV area alone "
    "uncachable; the CPU flushes and uses non-temporal stores for the rest) and run `belugactl setup -f {m}`, "
    "which replaces the MTRRs it added; remove others with `echo disable=N > /proc/mtrr` (N from `cat /proc/mtrr`)"
)


def _split_layout(ctx: DoctorContext):  # -> PoolLayout | None
    layout = ctx.expect.layout if ctx.expect is not None else None
    return layout if layout is not None and getattr(layout, "split", False) else None


def _pool_base(ctx: DoctorContext) -> int | None:
    """Pool offset 0 in this host's physical addresses: the pool's dax device's start."""
    dax = ctx.pool_dax()
    return dax.resource if dax is not None and dax.resource is not None and dax.size else None


@REGISTRY.check("mtrr.kv-uncachable", "the shared KV area uncachable (MTRR) when the manifest splits memory types")
def mtrr_kv_uncachable(ctx: DoctorContext) -> CheckResult:
    if ctx.expect is None:
        return CheckResult.skip("no manifest: the KV area's place and memory type are the manifest's")
    layout = _split_layout(ctx)
    if layout is None:
        return CheckResult.skip("the manifest gives the whole pool one memory type (see mtrr.pool-uncachable)")
    base = _pool_base(ctx)
    if base is None:
        return CheckResult.skip("the pool's dax device (its physical base) is not known yet: needs setup")
    kv = layout.shared_kv
    start = base + kv.offset
    mtrr = ctx.snapshot.mtrr
    if mtrr is None:
        return CheckResult.fail(
            "/proc/mtrr is absent: this kernel or CPU offers no MTRRs, so the KV area cannot be made uncachable",
            "remove caching.memory_types (the pool stays write-back; the data plane flushes and uses "
            "non-temporal stores), or run on a host with MTRR support",
        )
    gaps = uncovered(start, kv.size, [(e.base, e.size) for e in mtrr if e.type == "uncachable"])
    details: dict[str, object] = {
        "kv_base": start, "kv_size": kv.size, "gaps": [{"base": b, "size": s} for b, s in gaps],
    }
    where = f"the KV area (pool offset {kv.offset:#x}, 0x{start:x}+{format_size(kv.size)})"
    if not gaps:
        return CheckResult.ok(f"{where} is covered by uncachable MTRRs", **details)
    lines = [
        f'echo "base=0x{b:x} size=0x{s:x} type=uncachable" > /proc/mtrr'
        for g_b, g_s in gaps
        for b, s in mtrr_pieces(g_b, g_s)
    ]
    missing = format_size(sum(s for _, s in gaps))
    total = _variable_mtrrs(ctx)
    if total is not None and len(lines) > total - len(mtrr):
        details["variable_mtrrs"] = total
        return CheckResult.fail(
            f"{missing} of {where} is not uncachable, and covering it takes {len(lines)} MTRR(s) while only "
            f"{max(total - len(mtrr), 0)} of {total} are free",
            "lower caching.kv_mtrrs (the layout aligns the KV area to fewer pieces), map the pool at a physical "
            "base aligned to its largest piece, or free firmware MTRRs in the BIOS",
            **details,
        )
    return CheckResult.fail(
        f"{missing} of {where} is not uncachable; {len(lines)} MTRR(s) needed",
        f"`belugactl setup -f {manifest_arg(ctx)} --only mtrr`, or as root: " + "; ".join(lines)
        + " (lost at reboot; the boot unit re-applies setup)",
        **details,
    )


@REGISTRY.check(
    "mtrr.control-cached", "the header, rings and journal outside uncachable MTRRs (the CPU polls them)",
    Severity.WARNING,
)
def mtrr_control_cached(ctx: DoctorContext) -> CheckResult:
    if ctx.expect is None or ctx.expect.layout is None:
        return CheckResult.skip("no manifest: where the header, rings and journal lie is the manifest's")
    base = _pool_base(ctx)
    if base is None:
        return CheckResult.skip("the pool's dax device (its physical base) is not known yet: needs setup")
    mtrr = ctx.snapshot.mtrr
    if mtrr is None:
        return CheckResult.ok("no MTRRs on this host: nothing makes the control areas uncachable")
    layout = ctx.expect.layout
    polled = [(base + e.offset, e.size) for e in layout.control_extents]
    hits = [
        e for e in mtrr
        if e.type == "uncachable"
        and any(e.base < b + s and b < e.base + e.size for b, s in polled)
    ]
    details = {"control": [{"base": b, "size": s} for b, s in polled], "uncachable": [e.reg for e in hits]}
    if not hits:
        return CheckResult.ok(
            f"the header, rings and journal (0x{polled[0][0]:x}+{format_size(layout.metadata.end)}) "
            "are outside every uncachable MTRR", **details
        )
    regs = ", ".join(f"reg{e.reg:02d} 0x{e.base:x}+{format_size(e.size)}" for e in hits)
    return CheckResult.warn(
        f"the CPU polls uncachable memory: the header, rings and journal lie in {regs}; every ring poll and "
        "journal write then goes to the device (a 16 KB store 281.56 us uncachable vs 2.41 us non-temporal)",
        POLL_FIX.format(m=manifest_arg(ctx)),
        **details,
    )
