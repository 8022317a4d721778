"""Apply a setup or teardown under the host lock, one step at a time, planning again after each.

Re-planning after every step is what makes setup safe to run again: a step is applied only if
the host, read just now, still needs it; every command is computed from the host as it is; and a
step that is still needed right after it was applied is reported as a failure (it did not take),
not retried forever. The first failure stops the run and the error says what was done and what
was not. What setup made is written to the state file after each step, so teardown can undo it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from belugactl.errors import BelugaError, EnvironmentProblem, StepFailed
from belugactl.host.host import Host
from belugactl.host.write_mtrr import add_mtrr, read_mtrr, remove_mtrr
from belugactl.host.write_pci import rmw_config_byte
from belugactl.host.write_state import boot_id, load_state, save_state, setup_lock
from belugactl.host.write_sysfs import bracketed_choice, write_attr
from belugactl.host.write_udev import RULE_FILE, remove_file, set_ownership, write_config_file
from belugactl.model.plan import (
    Action,
    MtrrAdd,
    MtrrRemove,
    PciConfigRmw,
    Plan,
    RemoveFile,
    RunCommand,
    SetOwnership,
    Step,
    WriteAttr,
    WriteFile,
    WritePoolHeader,
)
from belugactl.workflows.setup.facts import Discover, SetupFacts, observe
from belugactl.workflows.setup.planner import plan_setup, plan_teardown
from belugactl.workflows.setup.steps_header import write_or_verify_header
from belugactl.workflows.setup.steps_pool import find_pool_namespace, find_pool_region
from belugactl.workflows.setup.target import SetupTarget

Progress = Callable[[str, Step, str | None], None]  # (event "start"|"done"|"failed", step, detail)


class ForceRequired(BelugaError):
    """The plan destroys data and --force was not given; nothing was changed."""


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
    topics = list(only) if only else None

    def planner(facts: SetupFacts) -> Plan:
        return plan_setup(target, facts, force=force, only=topics)

    return _run("setup", host, target, planner, force, dry_run, discover, progress, max_steps)


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

    return _run("teardown", host, target, planner, force, dry_run, discover, progress, 64)


def _run(
    verb: str,
    host: Host,
    target: SetupTarget,
    planner: Callable[[SetupFacts], Plan],
    force: bool,
    dry_run: bool,
    discover: Discover | None,
    progress: Progress | None,
    max_steps: int,
) -> ApplyReport:
    start = time.monotonic()
    if dry_run:
        facts = observe(host, target, load_state(host), discover=discover)
        plan = planner(facts)
        return ApplyReport(verb, target.host, True, plan, remaining=list(plan.steps),
                           duration_s=time.monotonic() - start)
    with setup_lock(host):
        state = load_state(host)
        facts = observe(host, target, state, discover=discover)
        plan = planner(facts)
        report = ApplyReport(verb, target.host, False, plan)
        _refuse_without_force(plan, force)
        applied_ids: set[str] = set()
        while True:
            ready = [s for s in plan.steps if not s.deferred]
            if not ready:
                report.remaining = list(plan.steps)
                if plan.steps:
                    report.failed = plan.steps[0]
                    raise SetupFailed(
                        StepFailed(
                            f"{len(plan.steps)} step(s) still wait for something no step provides",
                            why="; ".join(f"{s.id}: {s.note}" for s in plan.steps),
                        ),
                        report,
                    )
                break
            step = ready[0]
            if step.id in applied_ids or len(report.applied) >= max_steps:
                report.failed = step
                report.remaining = list(plan.steps)
                raise SetupFailed(
                    StepFailed(
                        f"step {step.id} is still needed after it was applied",
                        why=f"the host reads: {step.before}; wanted: {step.after}",
                        fix="something on the host undoes it; look at dmesg and at other tools managing this setting",
                    ),
                    report,
                )
            try:
                _refuse_without_force(Plan(plan.host, verb, [step]), force)
            except ForceRequired as exc:
                if not report.applied:
                    raise
                report.failed = step
                report.remaining = list(plan.steps)
                raise SetupFailed(exc, report) from exc
            if progress:
                progress("start", step, None)
            t0 = time.monotonic()
            try:
                detail = _apply_step(host, target, step, facts, state)
            except BelugaError as exc:
                report.failed = step
                report.remaining = list(plan.steps)
                if progress:
                    progress("failed", step, exc.what)
                save_state(host, state)
                raise SetupFailed(exc, report) from exc
            report.applied.append(StepOutcome(step, time.monotonic() - t0, detail))
            applied_ids.add(step.id)
            facts = observe(host, target, state, discover=discover)
            _record_created(step, target, facts, state, verb)
            save_state(host, state)
            if progress:
                progress("done", step, detail)
            try:
                plan = planner(facts)
            except BelugaError as exc:
                # E.g. the device just created holds a header from another manifest: stop, report what ran.
                raise SetupFailed(exc, report) from exc
        report.duration_s = time.monotonic() - start
        return report


def _refuse_without_force(plan: Plan, force: bool) -> None:
    risky = plan.destructive
    if risky and not force:
        raise ForceRequired(
            f"{len(risky)} step(s) would destroy data; nothing was changed",
            why="\n".join(f"{s.id}: {s.summary}" + (f" ({s.note})" if s.note else "") for s in risky),
            fix="review with `belugactl plan`; rerun with --force to accept the loss of the pool's contents",
        )


# --- executing actions ----------------------------------------------------------------------
def _apply_step(host: Host, target: SetupTarget, step: Step, facts: SetupFacts, state: dict[str, Any]) -> str | None:
    details = []
    _remember_previous(step, facts, state)
    for action in step.actions:
        text = _apply_action(host, target, action, state)
        if text:
            details.append(text)
    return "; ".join(details) or None


def _apply_action(host: Host, target: SetupTarget, action: Action, state: dict[str, Any]) -> str | None:
    if isinstance(action, RunCommand):
        result = host.run(action.argv, timeout=action.timeout)
        if result.not_found:
            raise EnvironmentProblem(
                f"{action.argv[0]} is not installed",
                fix="install ndctl (it provides cxl, ndctl and daxctl)",
            )
        if not result.ok:
            hint = {
                "EBUSY": "the device is in use (mounted, mapped, or onlined as system RAM)",
                "ENOSPC": "not enough free capacity",
                "ENXIO": "the device or address range is unreachable (region commit failed?)",
                "EOPNOTSUPP": "this kernel or tool version does not support the operation",
            }.get(result.errno_name or "")
            raise StepFailed(
                f"`{action.display()}` failed",
                why=result.describe() + (f"\n{hint}" if hint else ""),
                fix="see the tool's message above; `belugactl doctor` checks the usual causes",
            )
        return None
    if isinstance(action, WriteAttr):
        back = write_attr(host, action.path, action.value)
        if "/hugepages/" in action.path:
            got = int(back) if back and back.strip().isdigit() else None
            if got != int(action.value):
                raise StepFailed(
                    f"asked the kernel for {action.value} hugepages, it reserved {got if got is not None else '?'}",
                    why=f"{action.path}: the NUMA node has too little free contiguous memory",
                    fix="free memory on that node (stop services, `echo 1 > /proc/sys/vm/compact_memory`), "
                    "or reserve hugepages at boot (kernel parameter hugepages=)",
                )
            return f"{action.path} = {got}"
        if action.path.endswith("transparent_hugepage/enabled"):
            got_mode = bracketed_choice(back)
            if got_mode != action.value:
                raise StepFailed(f"THP reads {got_mode} after writing {action.value}", why=f"{action.path}: {back}")
            return f"THP {got_mode}"
        return None
    if isinstance(action, WriteFile):
        write_config_file(host, action.path, action.text, action.mode)
        return None
    if isinstance(action, RemoveFile):
        remove_file(host, action.path)
        return None
    if isinstance(action, SetOwnership):
        set_ownership(host, action.path, action.owner, action.group, action.mode)
        return None
    if isinstance(action, PciConfigRmw):
        before, after = rmw_config_byte(
            host, action.bdf, action.offset, clear_bits=action.clear_bits, set_bits=action.set_bits,
            expect=action.expect,
        )
        return f"{action.bdf} 0x{action.offset:x}: 0x{before:02x} -> 0x{after:02x}"
    if isinstance(action, MtrrAdd):
        current_boot = boot_id(host)
        if state.get("boot_id") != current_boot:
            state["mtrr"] = []  # entries remembered from an earlier boot died with it
            state["boot_id"] = current_boot
        entry = add_mtrr(host, action.base, action.size, action.type)
        state.setdefault("mtrr", []).append({"reg": entry.reg, "base": entry.base, "size": entry.size})
        return f"reg{entry.reg:02d} base=0x{entry.base:x} size=0x{entry.size:x}"
    if isinstance(action, MtrrRemove):
        listed = read_mtrr(host) or []
        if not any(e.reg == action.reg and e.base == action.base and e.size == action.size for e in listed):
            raise StepFailed(
                f"MTRR reg{action.reg:02d} no longer holds base=0x{action.base:x} size=0x{action.size:x}",
                why="someone changed /proc/mtrr since setup; nothing was removed",
                fix="inspect `cat /proc/mtrr` and remove entries by hand if they are belugactl's",
            )
        remove_mtrr(host, action.reg)
        state["mtrr"] = [m for m in state.get("mtrr", []) if m["reg"] != action.reg]
        return f"reg{action.reg:02d} removed"
    if isinstance(action, WritePoolHeader):
        if target.header is None:
            raise StepFailed("no header to write: the layout was not resolved")
        outcome = write_or_verify_header(host, action.device, target.header, rewrite=action.rewrite)
        state["header"] = {"device": action.device, "wrote": outcome.wrote, "claim": f"{outcome.claim:#x}"}
        if outcome.took_over:
            state["header"]["took_over"] = f"{outcome.took_over:#x}"
            return f"wrote the header (took over this host's stale claim {outcome.took_over:#018x})"
        return "wrote the header" if outcome.wrote else "another host wrote the header; verified it"
    raise TypeError(f"unknown action {action!r}")


def _remember_previous(step: Step, facts: SetupFacts, state: dict[str, Any]) -> None:
    """Values before the first setup touched them, so teardown can put them back."""
    previous = state.setdefault("previous", {})
    snap = facts.snapshot
    if step.topic == "hugepages" and step.id.startswith("hugepages.node"):
        node_id = int(step.id.removeprefix("hugepages.node"))
        node = snap.numa_node(node_id)
        for action in step.actions:
            if isinstance(action, WriteAttr) and node is not None:
                size = int(action.path.split("hugepages-")[-1].split("kB")[0]) * 1024
                count = node.hugepages.get(size)
                if count is not None and count.total is not None:
                    previous.setdefault("hugepages", {}).setdefault(str(node_id), count.total)
                    previous.setdefault("hugepage_size", size)
    elif step.topic == "thp" and snap.thp.enabled:
        previous.setdefault("thp", snap.thp.enabled)
    elif step.topic == "ddio":
        for action in step.actions:
            if isinstance(action, PciConfigRmw):
                saved = previous.setdefault("ddio", {}).setdefault(action.bdf, {})
                saved.setdefault(f"{action.offset:#x}", action.expect)


def _record_created(step: Step, target: SetupTarget, facts: SetupFacts, state: dict[str, Any], verb: str) -> None:
    created = state.setdefault("created", {})
    if verb == "teardown":
        if step.id == "region.destroy":
            created.pop("region", None)
        elif step.id == "devdax.destroy":
            created.pop("namespace", None)
        elif step.id == "permissions.dax":
            created.pop("udev_rule", None)
        elif step.topic == "hugepages":
            state.get("previous", {}).get("hugepages", {}).pop(step.id.removeprefix("hugepages.node"), None)
        elif step.topic == "thp":
            state.get("previous", {}).pop("thp", None)
        elif step.topic == "ddio":
            state.get("previous", {}).get("ddio", {}).pop(step.id.removeprefix("ddio."), None)
        return
    if step.id == "region.create":
        region = find_pool_region(target, facts)
        if region is not None:
            created["region"] = region.name
    elif step.id in ("devdax.create", "devdax.reconfigure"):
        ns = find_pool_namespace(target, facts)
        if ns is not None:
            created["namespace"] = ns.dev
    elif step.id == "permissions.dax" and any(isinstance(a, WriteFile) for a in step.actions):
        created["udev_rule"] = RULE_FILE
