"""The transparent hugepage mode: a kernel setting a reboot resets."""

from __future__ import annotations

from belugactl.errors import StepFailed
from belugactl.host.write_sysfs import THP_ENABLED, bracketed_choice
from belugactl.model.setup_plan import Skip, Step, WriteAttr
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State

ID = "thp"


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    if target.thp is None:
        return Planned(skipped=[Skip(ID, "the manifest leaves THP as it is")])
    current = facts.snapshot.thp.enabled
    if current == target.thp:
        return Planned()
    return Planned(steps=[
        Step(
            id="thp.enabled",
            topic=ID,
            summary=f"transparent hugepages: {target.thp}",
            actions=(WriteAttr(THP_ENABLED, target.thp),),
            before=current or "unknown",
            after=target.thp,
            note="affects processes started afterwards: restart vLLM workers",
        )
    ])


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    previous = facts.state.get("previous", {})
    current = facts.snapshot.thp.enabled
    if "thp" not in previous or current in (None, previous["thp"]):
        return Planned()
    return Planned(steps=[
        Step(
            id="thp.enabled",
            topic=ID,
            summary=f"transparent hugepages back to {previous['thp']}",
            actions=(WriteAttr(THP_ENABLED, previous["thp"]),),
            before=current,
            after=previous["thp"],
        )
    ])


def check_write(action: WriteAttr, back: str | None) -> str:
    got = bracketed_choice(back)
    if got != action.value:
        raise StepFailed(f"THP reads {got} after writing {action.value}", why=f"{action.path}: {back}")
    return f"THP {got}"


def remember(step: Step, facts: SetupFacts, state: State) -> None:
    if facts.snapshot.thp.enabled:
        state.setdefault("previous", {}).setdefault("thp", facts.snapshot.thp.enabled)


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    if verb == "teardown":
        state.get("previous", {}).pop("thp", None)


TOPIC = SetupTopic(
    id=ID,
    order=60,
    summary="the transparent hugepage mode",
    plan=plan,
    teardown=teardown,
    check_write=check_write,
    remember=remember,
    record=record,
    changes=frozenset({"thp"}),
)
