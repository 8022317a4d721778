"""The ndctl family of tools: present, and new enough for what the pool needs."""

from __future__ import annotations

from belugactl.workflows.doctor.checks.common import NO_CXL
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult

# `cxl create-region -t ram` and the region `type` key arrived in ndctl v77 (reference/cxl-tooling.md 2.1).
NDCTL_RAM_REGIONS = 77
# Debian and Ubuntu ship cxl, ndctl and daxctl in these packages.
PACKAGES = {"cxl": "ndctl", "ndctl": "ndctl", "daxctl": "daxctl"}


def needs_ram_regions(ctx: DoctorContext) -> bool:
    """Whether the pool is (or must be) a ram region, which needs ndctl >= 77 and kernel >= 6.3."""
    if ctx.expect is not None:
        return ctx.expect.source == "region" and ctx.expect.region_type == "ram"
    snap = ctx.snapshot
    if any(r.type == "ram" for r in snap.cxl.regions):
        return True
    roots = snap.cxl.root_decoders
    # Root decoders that can only decode volatile memory leave no pmem path.
    return bool(roots) and not any(d.pmem_capable for d in roots) and any(d.volatile_capable for d in roots)


def _tool_present(ctx: DoctorContext, name: str, purpose: str) -> CheckResult:
    tool = ctx.snapshot.tool(name)
    if tool.installed:
        version = f" {tool.version}" if tool.version else ""
        if tool.error:
            return CheckResult.warn(
                f"{name}{version} at {tool.path} but `{name} version` failed: {tool.error}",
                f"reinstall it: apt-get install --reinstall {PACKAGES[name]}",
                path=tool.path,
            )
        return CheckResult.ok(f"{name}{version} at {tool.path}", path=tool.path, version=tool.version)
    if not ctx.has_cxl and ctx.expect is None:
        return CheckResult.skip(f"{name} is not installed; {NO_CXL}, so it is not needed")
    return CheckResult.fail(
        f"{name} is not installed; it is needed to {purpose}",
        f"apt-get install {PACKAGES[name]}   (dnf install {PACKAGES[name]} on Fedora/RHEL)",
    )


@REGISTRY.check("tools.cxl-present", "cxl tool installed")
def cxl_present(ctx: DoctorContext) -> CheckResult:
    return _tool_present(ctx, "cxl", "list CXL memory devices and build the pool's region")


@REGISTRY.check("tools.ndctl-present", "ndctl tool installed")
def ndctl_present(ctx: DoctorContext) -> CheckResult:
    return _tool_present(ctx, "ndctl", "create the pool's devdax namespace")


@REGISTRY.check("tools.daxctl-present", "daxctl tool installed")
def daxctl_present(ctx: DoctorContext) -> CheckResult:
    return _tool_present(ctx, "daxctl", "inspect and reconfigure dax devices")


@REGISTRY.check("tools.ndctl-version", "ndctl new enough for the pool's region type")
def ndctl_version(ctx: DoctorContext) -> CheckResult:
    tools = [ctx.snapshot.tool(n) for n in ("cxl", "ndctl", "daxctl")]
    known = [t for t in tools if t.installed and t.major is not None]
    if not known:
        return CheckResult.skip("no version known: the ndctl tools are not installed (see tools.*-present)")
    oldest = min(known, key=lambda t: (t.major or 0, t.minor or 0))
    versions = {t.name: t.version for t in known}
    if needs_ram_regions(ctx):
        if (oldest.major or 0) < NDCTL_RAM_REGIONS:
            return CheckResult.fail(
                f"{oldest.name} {oldest.version} cannot create ram regions (needs >= {NDCTL_RAM_REGIONS})",
                f"install ndctl >= {NDCTL_RAM_REGIONS} (e.g. from backports: apt-get install -t bookworm-backports "
                "ndctl daxctl), or build the pool from a pmem region",
                versions=versions,
            )
        return CheckResult.ok(f"{oldest.name} {oldest.version} supports ram regions", versions=versions)
    if (oldest.major or 0) >= NDCTL_RAM_REGIONS:
        return CheckResult.ok(f"ndctl tools {oldest.version} (ram and pmem regions)", versions=versions)
    if ctx.expect is not None or any(r.type == "pmem" for r in ctx.snapshot.cxl.regions):
        # The manifest asks for a pmem region or an existing dax device, or the host's pool already
        # is a pmem region: this version builds and manages that.
        why = "this manifest's pool" if ctx.expect is not None else "this host's pmem region"
        return CheckResult.ok(f"ndctl tools {oldest.version}: enough for {why} (not a ram region)", versions=versions)
    if not ctx.has_cxl and ctx.expect is None:
        reason = f"ndctl tools {oldest.version}; {NO_CXL}, so no region is built here"
        return CheckResult.skip(reason, versions=versions)
    # No manifest says which pool: the production path is a ram region, which this version cannot build.
    return CheckResult.warn(
        f"{oldest.name} {oldest.version} cannot create ram regions, the production pool (needs >= "
        f"{NDCTL_RAM_REGIONS}); pmem regions only",
        f"install ndctl >= {NDCTL_RAM_REGIONS} (e.g. apt-get install -t bookworm-backports ndctl daxctl), "
        "or check against a manifest whose pool is pmem: belugactl doctor -f rack.yaml",
        versions=versions,
    )
