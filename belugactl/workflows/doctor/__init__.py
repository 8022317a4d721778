"""`belugactl doctor`: named health checks, each ok / warn / fail / skip with a reason and the exact fix.

    from belugactl.workflows.doctor import run_doctor
    report = run_doctor(Host.local(), rack=load_rack_context("rack.yaml"))
    report.exit_code, [o.to_dict() for o in report.outcomes]

Checks live in `checks/` (one module per topic) and register in `registry.REGISTRY`; each is
`func(ctx: DoctorContext) -> CheckResult`. The runner runs them all, turns a crashing check into a
failure, and applies `--ignore`.
"""

from belugactl.workflows.doctor.check_runner import run_checks, validate_ignores
from belugactl.workflows.doctor.context import DoctorContext, Expectations, HugepageWant
from belugactl.workflows.doctor.registry import REGISTRY, Check, Registry
from belugactl.workflows.doctor.result import CheckOutcome, CheckResult, DoctorReport, Severity, Status
from belugactl.workflows.doctor.workflow import builtin_registry, run_doctor

__all__ = [
    "REGISTRY",
    "Check",
    "CheckOutcome",
    "CheckResult",
    "DoctorContext",
    "DoctorReport",
    "Expectations",
    "HugepageWant",
    "Registry",
    "Severity",
    "Status",
    "builtin_registry",
    "run_checks",
    "run_doctor",
    "validate_ignores",
]
