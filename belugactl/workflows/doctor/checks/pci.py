"""PCI: GPUs (count, NUMA locality), the root ports above GPUs and CXL adapters, and link health."""

from __future__ import annotations

import re
from collections import Counter

from belugactl.host.snapshot import PciDevice
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity


@REGISTRY.check("gpu.count", "the GPUs the manifest lists for this host are on the PCI bus")
def gpu_count(ctx: DoctorContext) -> CheckResult:
    found = len(ctx.snapshot.gpus)
    want = ctx.expect.gpus if ctx.expect is not None else None
    if not want:
        return CheckResult.skip(f"no GPU count in a manifest for this host ({found} GPU(s) found)")
    if found < want:
        return CheckResult.fail(
            f"{found} GPU(s) on the PCI bus, the manifest expects {want}",
            "check `lspci -d 10de:` and `nvidia-smi -L`; a GPU that fell off the bus needs a reset or reboot; "
            "or correct hosts[].gpus.count",
        )
    if found > want:
        return CheckResult.warn(f"{found} GPU(s) found, the manifest expects {want}", "correct hosts[].gpus.count")
    return CheckResult.ok(f"{found} GPU(s), as the manifest expects")


@REGISTRY.check("gpu.numa-locality", "every GPU's NUMA node is known", Severity.WARNING)
def gpu_numa_locality(ctx: DoctorContext) -> CheckResult:
    gpus = ctx.snapshot.gpus
    if not gpus:
        return CheckResult.skip("no GPUs on the PCI bus")
    unknown = [g.bdf for g in gpus if g.numa_node is None]
    if unknown:
        return CheckResult.warn(
            f"NUMA node unknown (sysfs numa_node -1) for GPU(s) {', '.join(unknown)}: workers cannot be bound "
            "next to their GPU",
            "enable NUMA / proximity reporting in the BIOS (SRAT, 'NUMA nodes per socket'); "
            "in a VM, give the guest a NUMA topology",
        )
    per_node = Counter(g.numa_node for g in gpus)
    return CheckResult.ok(
        f"{len(gpus)} GPU(s): " + ", ".join(f"node {n}: {c}" for n, c in sorted(per_node.items())),
        gpus={g.bdf: g.numa_node for g in gpus},
    )


def _watched(ctx: DoctorContext) -> list[PciDevice]:
    return [d for d in ctx.snapshot.pci if d.kind in ("gpu", "cxl")]


@REGISTRY.check("pci.root-ports-found", "the root port above every GPU and CXL adapter is found", Severity.WARNING)
def root_ports_found(ctx: DoctorContext) -> CheckResult:
    devices = _watched(ctx)
    if not devices:
        return CheckResult.skip("no GPUs or CXL adapters on the PCI bus")
    known = {p.bdf for p in ctx.snapshot.root_ports}
    missing = [d.bdf for d in devices if not d.root_port or d.root_port not in known]
    if missing:
        return CheckResult.warn(
            f"no root port found above {', '.join(missing)}: DDIO cannot be checked or set for them",
            "look at `lspci -tv`; run doctor as root so the bridges' config space can be read",
        )
    per_port = Counter(d.root_port for d in devices)
    return CheckResult.ok(
        f"{len(devices)} device(s) behind {len(per_port)} root port(s): "
        + ", ".join(f"{p} ({n})" for p, n in sorted(per_port.items()))
    )


def _gts(speed: str | None) -> float | None:
    match = re.match(r"^\s*([\d.]+)\s*GT/s", speed or "")
    return float(match[1]) if match else None


@REGISTRY.check(
    "pci.link-trained", "GPU and CXL adapter links trained at full width (and CXL at full speed)", Severity.WARNING
)
def link_trained(ctx: DoctorContext) -> CheckResult:
    devices = _watched(ctx)
    if not devices:
        return CheckResult.skip("no GPUs or CXL adapters on the PCI bus")
    degraded = []
    checked = 0
    for dev in devices:
        if dev.link_width and dev.max_link_width:
            checked += 1
            if dev.link_width < dev.max_link_width:
                degraded.append(f"{dev.bdf} ({dev.kind}) x{dev.link_width} of x{dev.max_link_width}")
        # GPUs lower their link speed when idle to save power; only the CXL adapters' speed is meaningful here.
        now, top = _gts(dev.link_speed), _gts(dev.max_link_speed)
        if dev.kind == "cxl" and now and top:
            checked += 1
            if now < top:
                degraded.append(f"{dev.bdf} (cxl) {dev.link_speed} of {dev.max_link_speed}")
    if not checked:
        return CheckResult.skip("link width and speed not reported")
    if degraded:
        return CheckResult.warn(
            "degraded link(s): " + "; ".join(degraded) + ": bandwidth to the pool or GPU drops with it",
            "reseat the card or cable, check the slot's bifurcation in the BIOS; "
            "`lspci -vv -s BDF` shows LnkSta vs LnkCap",
        )
    return CheckResult.ok(f"{len(devices)} link(s) at full width" + (" and speed" if ctx.snapshot.cxl_adapters else ""))
