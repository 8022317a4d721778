"""Apply a setup or teardown under the host lock, one step at a time, planning again after each.

Re-planning after every step is what makes setup safe to run again: a step is applied only if
the host, read just now, still needs it; every command is computed from the host as it is; and a
step that is still needed right after it was applied is reported as a failure (it did not take),
not retried forever. The first failure stops the run and the error says what was done and what
was not. What setup made is written to the state file after each step, so teardown can undo it.
Each step goes back to the topic that planned it (`step.topic`) for its executors and hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from belugactl.errors import BelugaError, StepFailed, set_interrupt_note
from belugactl.host.host import Host
from belugactl.host.setup_state import load_state, save_state, setup_lock
from belugactl.model.setup_plan import Plan, Step
from belugactl.workflows.setup import topics
from belugactl.workflows.setup.execute import execute
from belugactl.workflows.setup.facts import Discover, SetupFacts
from belugactl.workflows.setup.force import ForceRequired, refuse_without_force
from belugactl.workflows.setup.observe import observe
from belugactl.workflows.setup.planner import plan_setup, plan_teardown
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import ApplyContext

__all__ = ["ApplyReport", "ForceRequired", "SetupFailed", "StepOutcome", "run_setup", "run_teardown"]

Progress = Callable[[str, Step, str | None], None]  # (event "start"|"done"|"failed", step, detail)
Planner = Callable[[SetupFacts], Plan]


class SetupFailed(StepFailed):
    def __init__(self, cause: BelugaError, report: ApplyReport) -> None:
        self.cause = cause
        self.report = report
        done = ", ".join(o.step.id for o in report.applied) or "nothing"
        left = ", ".join(s.id for s in report.remaining) or "nothing"
        if isinstance(cause, ForceRequired):
            cause = BelugaError(cause.what.replace("; nothing was changed", ""), why=cause.why, fix=cause.fix)
        super().__init__(
            f"{report.verb} stopped at step {report.failed.id}: {cause.what}"
            if report.failed
            else f"{report.verb} stopped while planning the next step: {cause.what}",
            why=(cause.why + "\n" if cause.why else "") + f"done: {done}\nnot done: {left}",
            fix=(cause.fix + "; then " if cause.fix else "") + f"rerun `belugactl {report.verb}`: it continues "
            "from where the host is now",
        )
        self.exit_code = cause.exit_code

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["report"] = self.report.to_dict()
        return data


@dataclass
class StepOutcome:
    step: Step
    duration_s: float
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step.to_dict(), "duration_s": round(self.duration_s, 4), "detail": self.detail}


@dataclass
class ApplyReport:
    verb: str
    host: str
    dry_run: bool
    initial: Plan
    applied: list[StepOutcome] = field(default_factory=list)
    remaining: list[Step] = field(default_factory=list)
    failed: Step | None = None
    duration_s: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.applied)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "host": self.host,
            "dry_run": self.dry_run,
            "changed": self.changed,
            "plan": self.initial.to_dict(),
            "applied": [o.to_dict() for o in self.applied],
            "failed": self.failed.id if self.failed else None,
            "remaining": [s.to_dict() for s in self.remaining],
            "duration_s": round(self.duration_s, 3),
        }


def run_setup(
    host: Host,
    target: SetupTarget,
    *,
    force: bool = False,
    dry_run: bool = False,
    only: Iterable[str] | None = None,
    discover: Discover | None = None,
    progress: Progress | None = None,
    max_steps: int = 64,
) -> ApplyReport:
    topic_list = list(only) if only else None

    def planner(facts: SetupFacts) -> Plan:
        return plan_setup(target, facts, force=force, only=topic_list)

    return _Run("setup", host, target, planner, force, discover, progress, max_steps).go(dry_run)


def run_teardown(
    host: Host,
    target: SetupTarget,
    *,
    force: bool = False,
    dry_run: bool = False,
    discover: Discover | None = None,
    progress: Progress | None = None,
) -> ApplyReport:
    def planner(facts: SetupFacts) -> Plan:
        return plan_teardown(target, facts, force=force)

    return _Run("teardown", host, target, planner, force, discover, progress, 64).go(dry_run)


@dataclass
class _Run:
    verb: str
    host: Host
    target: SetupTarget
    planner: Planner
    force: bool
    discover: Discover | None
    progress: Progress | None
    max_steps: int

    def go(self, dry_run: bool) -> ApplyReport:
        start = time.monotonic()
        if dry_run:
            plan = self.planner(self._observe(load_state(self.host)))
            return ApplyReport(self.verb, self.target.host, True, plan, remaining=list(plan.steps),
                               duration_s=time.monotonic() - start)
        with setup_lock(self.host):
            report = self._apply_all()
        report.duration_s = time.monotonic() - start
        return report

    def _observe(self, state: dict[str, Any], previous: SetupFacts | None = None,
                 changed: frozenset[str] | None = None) -> SetupFacts:
        """Read the host: all of it, or after a step that declares what it can change, only that
        (`rediscover`) on top of the previous facts. An injected `discover` always reads it all."""
        if previous is None or changed is None or self.discover is not None:
            return observe(self.host, self.target, state, discover=self.discover)
        from belugactl.workflows.discover import rediscover

        snapshot = rediscover(self.host, previous.snapshot, changed)
        return observe(self.host, self.target, state, discover=lambda _host: snapshot)

    def _replan(self, facts: SetupFacts, report: ApplyReport) -> Plan:
        try:
            return self.planner(facts)
        except BelugaError as exc:
            # E.g. the device just created holds a header from another manifest: stop, report what ran.
            raise SetupFailed(exc, report) from exc

    def _apply_all(self) -> ApplyReport:
        state = load_state(self.host)
        facts = self._observe(state)
        plan = self.planner(facts)
        report = ApplyReport(self.verb, self.target.host, False, plan)
        refuse_without_force(plan.steps, self.force)
        applied_ids: set[str] = set()
        partial = False  # facts partly carried over from before the last step
        set_interrupt_note(f"no step applied yet, the host is as it was; {self.verb} re-plans when run again")
        while True:
            ready = [s for s in plan.steps if not s.deferred]
            if partial and (not ready or ready[0].id in applied_ids):
                # Done, stuck or repeating on partly re-read facts: decide only on a whole fresh read.
                facts = self._observe(state)
                plan = self._replan(facts, report)
                partial = False
                continue
            step = self._next_step(plan, report, applied_ids)
            if step is None:
                break
            self._gate(step, plan, report)
            self._apply(step, facts, state, plan, report)
            applied_ids.add(step.id)
            changed = topics.get(step.topic).changes
            facts = self._observe(state, facts, changed)
            partial = changed is not None and self.discover is None
            self._record(step, facts, state)
            save_state(self.host, state)
            set_interrupt_note(
                f"{len(report.applied)} step(s) applied (the last: {step.id}) and recorded; "
                f"{self.verb} re-plans from the host when run again"
            )
            if self.progress:
                self.progress("done", step, report.applied[-1].detail)
            plan = self._replan(facts, report)
        return report

    def _next_step(self, plan: Plan, report: ApplyReport, applied_ids: set[str]) -> Step | None:
        """The first step that can run now; None when the plan is done. A stuck plan is a failure."""
        ready = [s for s in plan.steps if not s.deferred]
        if not ready:
            if not plan.steps:
                return None
            self._stop(report, plan, plan.steps[0], StepFailed(
                f"{len(plan.steps)} step(s) still wait for something no step provides",
                why="; ".join(f"{s.id}: {s.note}" for s in plan.steps),
            ))
        step = ready[0]
        if step.id in applied_ids or len(report.applied) >= self.max_steps:
            self._stop(report, plan, step, StepFailed(
                f"step {step.id} is still needed after it was applied",
                why=f"the host reads: {step.before}; wanted: {step.after}",
                fix="something on the host undoes it; look at dmesg and at other tools managing this setting",
            ))
        return step

    def _gate(self, step: Step, plan: Plan, report: ApplyReport) -> None:
        """A re-plan may bring a destroying step the first plan did not have: same rule, before it runs."""
        try:
            refuse_without_force([step], self.force)
        except ForceRequired as exc:
            if not report.applied:
                raise
            self._stop(report, plan, step, exc)

    def _apply(self, step: Step, facts: SetupFacts, state: dict[str, Any], plan: Plan, report: ApplyReport) -> None:
        topic = topics.get(step.topic)
        if self.progress:
            self.progress("start", step, None)
        t0 = time.monotonic()
        state.setdefault("previous", {})
        set_interrupt_note(
            f"step {step.id} was running ({len(report.applied)} step(s) applied before it); "
            f"{self.verb} re-plans from the host when run again"
        )
        try:
            if self.verb == "setup" and topic.remember is not None:
                topic.remember(step, facts, state)  # values before the first setup touched them, for teardown
            ctx = ApplyContext(self.host, self.target, state, topic)
            details = [d for d in (execute(ctx, action) for action in step.actions) if d]
        except BelugaError as exc:
            if self.progress:
                self.progress("failed", step, exc.what)
            save_state(self.host, state)
            self._stop(report, plan, step, exc)
        report.applied.append(StepOutcome(step, time.monotonic() - t0, "; ".join(details) or None))

    def _record(self, step: Step, facts: SetupFacts, state: dict[str, Any]) -> None:
        state.setdefault("created", {})
        topic = topics.get(step.topic)
        if topic.record is not None:
            topic.record(step, self.target, facts, state, self.verb)

    def _stop(self, report: ApplyReport, plan: Plan, step: Step, cause: BelugaError) -> NoReturn:
        report.failed = step
        report.remaining = list(plan.steps)
        raise SetupFailed(cause, report) from cause
