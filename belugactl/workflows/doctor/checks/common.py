"""Small helpers the check modules share: the "no CXL here" skip and the "no manifest" skip."""

from __future__ import annotations

from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.result import CheckResult

NO_CXL = "no CXL on this host (no /sys/bus/cxl, no CXL memory devices or adapters)"
SETUP_FIX = "belugactl setup -f {manifest} --host {host}"


def skip_without_cxl(ctx: DoctorContext) -> CheckResult | None:
    """A skip when there is no CXL here and no manifest says there should be; else None."""
    if not ctx.has_cxl and ctx.expect is None:
        return CheckResult.skip(NO_CXL)
    return None


NO_MANIFEST_POOL = "no manifest names the pool's dax device, so the pool checks are skipped (pass -f rack.yaml)"
NO_MANIFEST_FIX = "belugactl doctor -f rack.yaml (the rack's manifest names the pool's device)"


def skip_without_manifest(ctx: DoctorContext) -> CheckResult | None:
    """A skip for the checks of the pool's own device when no manifest says which device it is.

    Without a manifest doctor never guesses the pool (the one CXL dax device, /dev/dax0.0): a wrong
    guess would read, judge or advise a setup --force on a device that is somebody else's."""
    if ctx.expect is None:
        return CheckResult.skip(NO_MANIFEST_POOL, fix=NO_MANIFEST_FIX)
    return None


def manifest_arg(ctx: DoctorContext) -> str:
    """The manifest as the user gave it with -f (quoted for a shell), or `MANIFEST` when none was given."""
    import shlex

    file = ctx.expect.manifest_file if ctx.expect is not None else None
    return shlex.quote(file) if file else "MANIFEST"


def setup_fix(ctx: DoctorContext) -> str:
    host = ctx.expect.host_name if ctx.expect is not None else "NAME"
    return SETUP_FIX.format(manifest=manifest_arg(ctx), host=host)


def names(items: list[str]) -> str:
    return ", ".join(items) if items else "none"
