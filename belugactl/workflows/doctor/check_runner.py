"""Run every check, turn crashes into failures, apply `--ignore`, and build one report."""

from __future__ import annotations

import traceback
from collections.abc import Iterable

from belugactl.errors import UsageError
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import Check, Registry
from belugactl.workflows.doctor.result import CheckOutcome, CheckResult, Severity, Status

IGNORE_ALL = "all"


def validate_ignores(registry: Registry, names: Iterable[str]) -> frozenset[str]:
    """The `--ignore` names as check ids; an unknown name is a usage error with did-you-mean."""
    wanted: set[str] = set()
    for raw in names:
        # kubeadm accepts comma lists as well as repeated flags; so do we.
        for name in (part.strip().lower() for part in raw.split(",")):
            if not name:
                continue
            if name == IGNORE_ALL or name in registry:
                wanted.add(name)
                continue
            suggestions = registry.suggest(name)
            hint = f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""
            raise UsageError(
                f"--ignore {name}: no check has that id{hint}",
                why="known check ids: " + ", ".join(registry.ids) + f", or `{IGNORE_ALL}`",
                fix="`belugactl doctor --list` prints every check id with its title",
            )
    return frozenset(wanted)


def run_one(check: Check, ctx: DoctorContext) -> tuple[CheckResult, bool]:
    """A check's result and whether it crashed. A check that raises fails with its error, never a traceback."""
    try:
        result = check.run(ctx)
        if not isinstance(result, CheckResult):
            raise TypeError(f"check returned {type(result).__name__}, not CheckResult")
    except Exception as exc:  # noqa: BLE001 - one broken check must not kill the report (flutter doctor)
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}" if where else ""
        return (
            CheckResult.fail(
                f"the check itself crashed: {type(exc).__name__}: {exc}",
                f"this is a belugactl bug; report it with `belugactl discover --capture bundle.tar.gz`"
                f" attached, and meanwhile `--ignore {check.id}`",
                error=f"{type(exc).__name__}: {exc}{at}",
            ),
            True,
        )
    return result, False


def run_checks(registry: Registry, ctx: DoctorContext, ignore: frozenset[str] = frozenset()) -> list[CheckOutcome]:
    outcomes: list[CheckOutcome] = []
    for check in registry:
        result, crashed = run_one(check, ctx)
        if result.status is Status.FAIL and check.severity is Severity.WARNING and not crashed:
            # A warning-severity check can find a problem but never fail the run on its own.
            result = CheckResult(Status.WARN, result.reason, result.fix, result.details)
        ignored = False
        if result.status is Status.FAIL and (check.id in ignore or IGNORE_ALL in ignore):
            result = CheckResult(
                Status.WARN, result.reason + " (failure ignored: --ignore)", result.fix, result.details
            )
            ignored = True
        outcomes.append(
            CheckOutcome(
                check.id,
                check.title,
                check.topic,
                result,
                severity=check.severity.value,
                ignored=ignored,
                crashed=crashed,
                guards_data=check.guards_data,
            )
        )
    return outcomes
