"""Kernel facts: the CXL bus, a kernel new enough for ram regions, and lockdown."""

from __future__ import annotations

import re

from belugactl.workflows.doctor.checks.common import NO_CXL
from belugactl.workflows.doctor.checks.tools import needs_ram_regions
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult

# RAM (volatile) CXL regions: create_ram_region and region mode arrived in Linux 6.3 (sysfs-bus-cxl).
KERNEL_RAM_REGIONS = (6, 3)
CXL_MODULES = ("cxl_acpi", "cxl_pci", "cxl_port", "cxl_mem", "cxl_pmem", "dax_pmem", "device_dax")


def kernel_version(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", release or "")
    return (int(match[1]), int(match[2])) if match else None


@REGISTRY.check("kernel.cxl-bus", "kernel CXL drivers loaded (/sys/bus/cxl)")
def cxl_bus(ctx: DoctorContext) -> CheckResult:
    snap = ctx.snapshot
    modprobe = "modprobe -a " + " ".join(CXL_MODULES)
    container = " (running in a container: /sys may be the host's view or hidden)" if snap.kernel.in_container else ""
    if snap.cxl.bus_present:
        unbound = [d for d in snap.cxl_adapters if d.driver != "cxl_pci"]
        if unbound:
            described = ", ".join(f"{d.bdf} ({d.driver or 'no driver'})" for d in unbound)
            return CheckResult.fail(
                f"CXL adapter(s) not bound to cxl_pci: {described}: their memory devices cannot appear",
                modprobe + "; if an adapter stays unbound, `dmesg | grep -i cxl` says why",
                adapters=[d.bdf for d in unbound],
            )
        return CheckResult.ok(
            f"/sys/bus/cxl present: {len(snap.cxl.memdevs)} memdev(s), buses {', '.join(snap.cxl.buses) or 'none'}"
        )
    adapters = [d.bdf for d in snap.cxl_adapters]
    if adapters:
        return CheckResult.fail(
            f"CXL adapter(s) {', '.join(adapters)} on PCI but no /sys/bus/cxl: the CXL drivers are not loaded"
            + container,
            modprobe,
            adapters=adapters,
        )
    if ctx.expect is not None and ctx.expect.source == "region":
        return CheckResult.fail(
            "the manifest builds the pool from CXL memory devices, but this kernel shows no CXL bus" + container,
            f"{modprobe}; if /sys/bus/cxl is still missing, the kernel lacks CONFIG_CXL_BUS or the firmware "
            "does not describe the CXL host bridges (ACPI CEDT)",
        )
    if ctx.expect is not None:
        return CheckResult.skip("no /sys/bus/cxl; the manifest's pool is an existing dax device, which needs none")
    return CheckResult.skip(NO_CXL + container)


@REGISTRY.check("kernel.version", "kernel new enough for the pool's region type")
def kernel_release(ctx: DoctorContext) -> CheckResult:
    release = ctx.snapshot.kernel.release
    version = kernel_version(release)
    if version is None:
        return CheckResult.skip(f"kernel release not known ({release!r})")
    if needs_ram_regions(ctx) and version < KERNEL_RAM_REGIONS:
        want = ".".join(map(str, KERNEL_RAM_REGIONS))
        return CheckResult.fail(
            f"kernel {release} cannot create CXL ram regions (needs >= {want})",
            f"boot a kernel >= {want} (e.g. Debian bookworm-backports linux-image-amd64), "
            "or build the pool from a pmem region",
            release=release,
        )
    return CheckResult.ok(f"kernel {release}", release=release)


def _wants_register_writes(ctx: DoctorContext) -> list[str]:
    """What doctor/setup would need to write through PCI config space or MSRs on this host."""
    wants: list[str] = []
    if ctx.is_intel and (ctx.has_cxl or ctx.expect is not None):
        ddio = ctx.expect.ddio if ctx.expect is not None else "disabled"
        if ddio in ("disabled", "enabled"):
            wants.append(f"setting DDIO {ddio} (PCI config writes to root ports, MSR 0xc8b)")
    return wants


@REGISTRY.check("kernel.lockdown", "kernel lockdown does not block the register writes setup needs")
def lockdown(ctx: DoctorContext) -> CheckResult:
    mode = ctx.snapshot.kernel.lockdown
    if mode is None:
        return CheckResult.skip("lockdown state not readable (/sys/kernel/security/lockdown absent: no lockdown LSM)")
    if mode == "none":
        return CheckResult.ok("lockdown is off (none)", lockdown=mode)
    wants = _wants_register_writes(ctx)
    if not wants:
        return CheckResult.ok(f"lockdown is {mode}; nothing this host needs is blocked by it", lockdown=mode)
    from belugactl.workflows.doctor.checks.caching import ddio_problem_ports

    if not ddio_problem_ports(ctx):
        return CheckResult.ok(
            f"lockdown is {mode}, which blocks PCI config and MSR writes, but DDIO already matches; nothing to write",
            lockdown=mode,
        )
    return CheckResult.fail(
        f"lockdown is {mode}: the kernel refuses the PCI config-space and MSR writes needed for {'; '.join(wants)}",
        "set DDIO in the BIOS (IIO configuration) instead, or boot with lockdown off (Secure Boot disabled, "
        "no lockdown= on the kernel command line); lockdown cannot be lowered at runtime",
        lockdown=mode,
    )
