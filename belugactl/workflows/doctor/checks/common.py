"""Small helpers the check modules share: the "no CXL here" skip and the "no manifest" skip."""

from __future__ import annotations

from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.result import CheckResult

NO_CXL = "no CXL on this host (no /sys/bus/cxl, no CXL memory devices or adapters)"
SETUP_FIX = "belugactl setup -f MANIFEST --host {host}"


def skip_without_cxl(ctx: DoctorContext) -> CheckResult | None:
    """A skip when there is no CXL here and no manifest says there should be; else None."""
    if not ctx.has_cxl and ctx.expect is None:
        return CheckResult.skip(NO_CXL)
    return None


def setup_fix(ctx: DoctorContext) -> str:
    host = ctx.expect.host_name if ctx.expect is not None else "NAME"
    return SETUP_FIX.format(host=host)


def names(items: list[str]) -> str:
    return ", ".join(items) if items else "none"
