"""The CXL side of the pool: memory devices, root decoder windows, the committed region."""

from __future__ import annotations

from belugactl.units import format_size
from belugactl.workflows.doctor.checks.common import manifest_arg, setup_fix, skip_without_cxl
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult
from belugactl.workflows.memdev_choice import (
    MemdevSelectionError,
    MemdevWant,
    choose_memdevs,
    describe_memdev,
    placed_facts,
)

FIRMWARE_POOL = "the manifest's pool is an existing dax device (firmware-provisioned)"


def _serial(value: int | None) -> str:
    return f"0x{value:x}" if value is not None else "?"


def _expects_region(ctx: DoctorContext) -> bool:
    return ctx.expect is None or ctx.expect.source != "dax"


@REGISTRY.check("cxl.memdevs-present", "CXL memory devices present (and the manifest's selection)")
def memdevs_present(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    memdevs = ctx.snapshot.cxl.memdevs
    if not memdevs:
        if not _expects_region(ctx):
            return CheckResult.skip(f"no CXL memdevs; {FIRMWARE_POOL}, so none are needed")
        return CheckResult.fail(
            "no CXL memory devices: nothing to build the pool from",
            "check `lspci | grep -i cxl` and the adapter/switch cabling, then `modprobe -a cxl_pci cxl_mem`; "
            "`cxl list -M` must show the devices",
        )
    described = [
        f"{m.name} ({format_size(m.ram_size or 0)} ram, {format_size(m.pmem_size or 0)} pmem, "
        f"serial {_serial(m.serial)})"
        for m in memdevs
    ]
    details: dict[str, object] = {"memdevs": [m.name for m in memdevs]}
    summary = f"{len(memdevs)} memdev(s)"
    if ctx.expect is not None and (ctx.expect.memdev_switch is not None or ctx.expect.memdev_count is not None):
        # The same choice setup makes, so doctor fails where setup would refuse, with the same facts.
        want = MemdevWant(switch=ctx.expect.memdev_switch, count=ctx.expect.memdev_count)
        try:
            placed = placed_facts(ctx.snapshot.cxl)
            chosen = choose_memdevs(memdevs, want, ctx.expect.region_type, placed=placed)
        except MemdevSelectionError as exc:
            return CheckResult.fail(f"{exc.what} ({exc.why})", exc.fix or "correct pool.source.memdevs", **details)
        details["chosen"] = [m.name for m in chosen]
        summary += f"; {want.describe()} picks, in interleave order"
        described = [describe_memdev(m, ctx.expect.region_type) for m in chosen]
        described += [f"not chosen: {m.name}" for m in memdevs if m not in chosen]
    if ctx.expect is not None and ctx.expect.memdev_serials:
        present = {m.serial for m in memdevs}
        missing = [s for s in ctx.expect.memdev_serials if s not in present]
        if missing:
            return CheckResult.fail(
                f"the manifest's memdev serial(s) {', '.join(_serial(s) for s in missing)} are not on this host "
                f"(found {', '.join(described)})",
                "check the adapter cabling and the switch's binding of those devices to this host, "
                "or correct pool.source.memdevs",
                **details,
            )
    disabled = [m.name for m in memdevs if m.state == "disabled"]
    if disabled:
        return CheckResult.warn(
            f"memdev(s) {', '.join(disabled)} disabled",
            "; ".join(f"cxl enable-memdev {name}" for name in disabled),
            **details,
        )
    return CheckResult.ok(f"{summary}: {', '.join(described)}", **details)


@REGISTRY.check("cxl.decoder-capacity", "a root decoder window can hold the pool")
def decoder_capacity(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    cxl = ctx.snapshot.cxl
    if not _expects_region(ctx):
        return CheckResult.skip(f"{FIRMWARE_POOL}: no region to decode")
    roots = cxl.root_decoders
    if not roots:
        if cxl.memdevs:
            return CheckResult.fail(
                "memdevs present but no root decoder: the firmware published no CXL memory window (CFMWS)",
                "enable the CXL memory window in the BIOS (CXL / memory expander settings), then reboot",
            )
        return CheckResult.skip("no root decoders and no memdevs (see cxl.memdevs-present)")
    used = [d for d in roots if d.region]
    if used:
        return CheckResult.ok(
            "pool region decoded through " + ", ".join(f"{d.name} ({d.region})" for d in used),
            decoders=[d.name for d in roots],
        )
    want_type = ctx.expect.region_type if ctx.expect is not None else None
    capable = [
        d
        for d in roots
        if want_type is None or (want_type == "pmem" and d.pmem_capable) or (want_type == "ram" and d.volatile_capable)
    ]
    describe = ", ".join(
        f"{d.name} {format_size(d.size or 0)} window, {format_size(d.max_available_extent or 0)} free"
        f"{' pmem' if d.pmem_capable else ''}{' ram' if d.volatile_capable else ''}"
        for d in roots
    )
    if not capable:
        return CheckResult.fail(
            f"no root decoder can decode {want_type} memory ({describe})",
            f"set pool.source.type to what the windows allow, or enable {want_type} in the BIOS CXL settings",
        )
    need = None
    if ctx.expect is not None:
        need = ctx.expect.region_size or ctx.expect.pool_size
    if need is not None:
        # Unknown free space (older ndctl) counts as the window size; the region build will say more.
        fits = [
            d
            for d in capable
            if (d.max_available_extent if d.max_available_extent is not None else d.size or 0) >= need
        ]
        if not fits:
            return CheckResult.fail(
                f"no root decoder has {format_size(need)} free for the pool ({describe})",
                "free space with `cxl destroy-region` of unused regions, or shrink pool.size / pool.source.region_size",
            )
        return CheckResult.ok(f"{fits[0].name} has room for the {format_size(need)} pool ({describe})")
    return CheckResult.ok(f"root decoder(s): {describe}")


@REGISTRY.check("cxl.region-committed", "the pool's CXL region exists, is committed and enabled")
def region_committed(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    if not _expects_region(ctx):
        return CheckResult.skip(f"{FIRMWARE_POOL}: no region to build")
    regions = ctx.snapshot.cxl.regions
    if not regions:
        if ctx.expect is not None:
            return CheckResult.fail("no CXL region yet: the pool is not set up", setup_fix(ctx))
        if ctx.snapshot.cxl.memdevs:
            return CheckResult.warn(
                "CXL memdevs but no region: no pool on this host yet",
                f"belugactl setup -f {manifest_arg(ctx)} (or `cxl create-region -m -d decoderX.Y -w 1 -t pmem memN`)",
            )
        return CheckResult.skip("no CXL memdevs, so no region (see cxl.memdevs-present)")
    uncommitted = [r for r in regions if r.decode_state not in (None, "commit")]
    if uncommitted:
        names = ", ".join(f"{r.name} (decode_state {r.decode_state})" for r in uncommitted)
        return CheckResult.fail(
            f"region(s) not committed: {names}: their addresses decode to nothing",
            "; ".join(f"cxl destroy-region -f {r.name}" for r in uncommitted) + f"; then {setup_fix(ctx)}",
        )
    disabled = [r.name for r in regions if r.state == "disabled"]
    if disabled:
        return CheckResult.fail(
            f"region(s) {', '.join(disabled)} committed but disabled: no dax device can appear",
            "; ".join(f"cxl enable-region {name}" for name in disabled),
        )
    described = ", ".join(
        f"{r.name} {r.type or '?'} {format_size(r.size or 0)} x{r.interleave_ways or '?'}"
        + (f" @0x{r.resource:x}" if r.resource is not None else "")
        for r in regions
    )
    return CheckResult.ok(f"committed: {described}", regions=[r.name for r in regions])


@REGISTRY.check("cxl.region-geometry", "the region matches the manifest (type, size, interleave)")
def region_geometry(ctx: DoctorContext) -> CheckResult:
    if ctx.expect is None:
        return CheckResult.skip("no manifest: nothing to compare the region with")
    if not _expects_region(ctx):
        return CheckResult.skip(f"{FIRMWARE_POOL}: no region to compare")
    regions = ctx.snapshot.cxl.regions
    if len(regions) != 1:
        if not regions:
            return CheckResult.skip("no region yet (see cxl.region-committed)")
        return CheckResult.warn(
            f"{len(regions)} regions ({', '.join(r.name for r in regions)}); doctor expects one pool region",
            "destroy the regions that are not the pool's: cxl destroy-region -f regionN",
        )
    region = regions[0]
    problems = []
    exp = ctx.expect
    if exp.region_type and region.type and region.type != exp.region_type:
        problems.append(f"type {region.type}, manifest says {exp.region_type}")
    if exp.interleave_ways and region.interleave_ways and region.interleave_ways != exp.interleave_ways:
        problems.append(f"{region.interleave_ways}-way interleave, manifest says {exp.interleave_ways}")
    if exp.region_size and region.size and region.size != exp.region_size:
        problems.append(f"size {format_size(region.size)}, manifest says {format_size(exp.region_size)}")
    if problems:
        return CheckResult.fail(
            f"{region.name}: " + "; ".join(problems),
            f"either correct pool.source in the manifest, or rebuild: cxl destroy-region -f {region.name}; "
            + setup_fix(ctx)
            + " (destroys the pool's contents on this host's view)",
        )
    return CheckResult.ok(f"{region.name} matches the manifest")
