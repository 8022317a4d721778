"""Who may open the pool's dax device: a udev rule (every boot) and chown/chmod (now)."""

from __future__ import annotations

from belugactl.host.host import Host
from belugactl.host.write_udev import RULE_FILE, rule_text
from belugactl.model.setup_plan import RemoveFile, SetOwnership, Step, WriteFile
from belugactl.pool.device import device_path
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.pool_lookup import pool_dax
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State, record_created

ID = "permissions"


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    dax = pool_dax(target, facts)
    perms = target.permissions
    if dax is None:
        return Planned(steps=[
            Step(
                id="permissions.dax",
                topic=ID,
                summary=f"udev rule and {perms.owner}:{perms.group} {perms.mode:04o} for the pool's dax device",
                deferred=True,
                note="the device name is known once it exists",
            )
        ])
    device = device_path(dax.name)
    text = rule_text(device, perms.owner, perms.group, perms.mode)
    actions: list = []
    before = []
    current_rule = facts.udev_rule
    if current_rule != text:
        actions.append(WriteFile(RULE_FILE, text))
        before.append("no matching udev rule" if current_rule is None else "a different udev rule")
    owner_ok = dax.dev_owner == perms.owner or (perms.owner.isdigit() and str(dax.dev_uid) == perms.owner)
    group_ok = dax.dev_group == perms.group or (perms.group.isdigit() and str(dax.dev_gid) == perms.group)
    mode_ok = dax.dev_mode is not None and (dax.dev_mode & 0o7777) == perms.mode
    if dax.dev_exists and not (owner_ok and group_ok and mode_ok):
        actions.append(SetOwnership(device, perms.owner, perms.group, perms.mode))
        mode = f"{dax.dev_mode & 0o7777:04o}" if dax.dev_mode is not None else "?"
        before.append(f"{device} is {dax.dev_owner or dax.dev_uid}:{dax.dev_group or dax.dev_gid} {mode}")
    if not actions:
        return Planned()
    return Planned(steps=[
        Step(
            id="permissions.dax",
            topic=ID,
            summary=f"{device} owned by {perms.owner}:{perms.group}, mode {perms.mode:04o} (now and at every boot)",
            actions=tuple(actions),
            before="; ".join(before),
            after=f"{perms.owner}:{perms.group} {perms.mode:04o}",
        )
    ])


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    if not facts.state.get("created", {}).get("udev_rule") or facts.udev_rule is None:
        return Planned()
    return Planned(steps=[
        Step(
            id="permissions.dax",
            topic=ID,
            summary="remove belugactl's udev rule for the pool device",
            actions=(RemoveFile(RULE_FILE),),
            note="the device node keeps its current owner until it is next created",
        )
    ])


def observe(host: Host, target: SetupTarget, facts: SetupFacts) -> None:
    facts.udev_rule = host.read_text(RULE_FILE)


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    wrote = any(isinstance(a, WriteFile) for a in step.actions)
    record_created(state, verb, "udev_rule", lambda: RULE_FILE if wrote else None)


TOPIC = SetupTopic(
    id=ID,
    order=30,
    summary="owner, group and mode of the pool's dax device (udev rule and now)",
    plan=plan,
    teardown=teardown,
    observe=observe,
    record=record,
    changes=frozenset({"dax"}),
)
