"""What a setup topic is: its plan, its teardown and its apply hooks, in one object per module.

Each module in `workflows/setup/topics/` defines `TOPIC = SetupTopic(...)`; the registry there finds
it. The planner calls `plan` (setup) and `teardown` in `order` (teardown in reverse); the applier
hands each step back to the topic named by `step.topic` (data, never the id's spelling): executors
for the topic's own action types, `check_write` for what the kernel reads back after a WriteAttr,
`remember` before a setup step changes a value (so teardown can restore it) and `record` after a
step ran (what setup created, or what teardown removed, in the state file).

Planners never see --force: a step says it destroys data (and what to raise or do instead), and
`force.py` decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from belugactl.host.host import Host
from belugactl.model.setup_plan import Action, Skip, Step, WriteAttr
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget

State = dict[str, Any]  # the state file (host/setup_state.py), changed in place


def record_created(state: State, verb: str, key: str, made: Callable[[], str | None]) -> None:
    """A topic's `record` for one thing setup creates: teardown forgets `key` in the state file's
    "created"; setup stores what `made()` names (asked only then), or leaves the entry as it is."""
    created = state.setdefault("created", {})
    if verb == "teardown":
        created.pop(key, None)
        return
    name = made()
    if name is not None:
        created[key] = name


@dataclass
class Planned:
    """What one topic contributes to a plan."""

    steps: list[Step] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ApplyContext:
    """What an executor may use: the host, the target, the state file, and the step's topic."""

    host: Host
    target: SetupTarget
    state: State
    topic: SetupTopic


Executor = Callable[[ApplyContext, Any], "str | None"]  # (context, action) -> detail for the report


def _nothing(target: SetupTarget, facts: SetupFacts) -> Planned:
    return Planned()


@dataclass(frozen=True)
class SetupTopic:
    id: str
    order: int  # planning order; teardown runs in reverse
    summary: str  # one line: what the topic makes of the host (help, completion)
    plan: Callable[[SetupTarget, SetupFacts], Planned]
    teardown: Callable[[SetupTarget, SetupFacts], Planned] = _nothing
    survives_reboot: bool = False  # False: kernel state the boot unit re-applies
    # Extra discovery topics this topic needs for a target (e.g. {"pci"}), given the state file.
    discovery: Callable[[SetupTarget, State], frozenset[str]] | None = None
    # Reads of the host beyond discovery, stored on the facts.
    observe: Callable[[Host, SetupTarget, SetupFacts], None] | None = None
    # The discovery topics this topic's steps can change: after one of them setup reads only those
    # again (plus every topic's own `observe`). None: anything, so read the whole host again.
    changes: frozenset[str] | None = None
    executors: Mapping[type, Executor] = field(default_factory=dict)  # for the topic's own action types
    check_write: Callable[[WriteAttr, str | None], str | None] | None = None  # read-back -> detail, or raise
    remember: Callable[[Step, SetupFacts, State], None] | None = None
    record: Callable[[Step, SetupTarget, SetupFacts, State, str], None] | None = None

    def executor_for(self, action: Action) -> Executor | None:
        return self.executors.get(type(action))
