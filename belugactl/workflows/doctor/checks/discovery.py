"""Discovery itself: facts it could not read leave other checks blind, so say which."""

from __future__ import annotations

from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity


@REGISTRY.check("discover.complete", "discovery read everything it looked for", Severity.WARNING)
def discover_complete(ctx: DoctorContext) -> CheckResult:
    problems = ctx.snapshot.problems
    if not problems:
        return CheckResult.ok("every file and tool output discovery needed was readable")
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return CheckResult.warn(
        f"{len(problems)} thing(s) could not be read or parsed: {shown}",
        "run as root for the facts that need it; `belugactl discover --json` lists them all under problems",
        problems=list(problems),
    )
