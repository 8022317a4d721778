"""Facts + target -> Plan, for setup (make the host match) and teardown (undo what setup made).

Topics (workflows/setup/topics/) are planned in their order; teardown asks them in reverse. A topic
whose object does not exist yet (the header of a dax device not yet created) contributes a deferred
step, and the applier plans again after each step, so every command it runs is computed from the
host as it is at that moment. What --force changes is decided by force.resolve, topic by topic, so
a refusal stops planning where the topic stands in the order.
"""

from __future__ import annotations

from collections.abc import Iterable

from belugactl.errors import UsageError
from belugactl.model.setup_plan import Plan
from belugactl.workflows.setup import force as force_gate
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topics import all_topics, topic_ids


def plan_setup(
    target: SetupTarget, facts: SetupFacts, *, force: bool = False, only: Iterable[str] | None = None
) -> Plan:
    chosen = set(only) if only else set(topic_ids())
    unknown = chosen - set(topic_ids())
    if unknown:
        raise UsageError(f"unknown setup topic(s): {', '.join(sorted(unknown))}",
                         fix=f"choose from {', '.join(topic_ids())}")
    plan = Plan(host=target.host, verb="setup")
    for topic in all_topics():
        if topic.id not in chosen:
            continue
        planned = topic.plan(target, facts)
        plan.steps.extend(force_gate.resolve(planned.steps, force))
        plan.skipped.extend(planned.skipped)
        plan.notes.extend(planned.notes)
    return plan


def plan_teardown(target: SetupTarget, facts: SetupFacts, *, force: bool = False) -> Plan:
    """Reverse what the state file says setup made, newest first. Nothing else is touched."""
    plan = Plan(host=target.host, verb="teardown")
    for topic in reversed(all_topics()):
        planned = topic.teardown(target, facts)
        plan.steps.extend(force_gate.resolve(planned.steps, force))
        plan.skipped.extend(planned.skipped)
        plan.notes.extend(planned.notes)
    return plan
