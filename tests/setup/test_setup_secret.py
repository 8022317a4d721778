"""Setup topic `secret`: the rack secret on the metadata host, planned (dry-run shows it), created
0600, idempotent, narrowed when too wide, and never replaced without --force."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from belugactl.dataplane.rpc import auth
from belugactl.errors import UsageError
from belugactl.host.host import Host
from belugactl.model.setup_plan import action_to_dict
from belugactl.workflows.setup import force
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.topic import ApplyContext
from belugactl.workflows.setup.topics import secret
from tests.support.fake_machine import lab_target

PATH = "/etc/belugactl/lab.secret"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host.from_tree(tmp_path)


def target(server: str = "lab-1"):
    return replace(lab_target("lab-1"), secret=secret.SecretTarget(PATH, str(os.geteuid()), server, "lab"))


def plan(host: Host, t, force_: bool = False):
    facts = SetupFacts(snapshot=None)  # type: ignore[arg-type] - the topic reads only its own facts
    secret.observe(host, t, facts)
    return force.resolve(secret.plan(t, facts).steps, force_)


def apply(host: Host, t, steps) -> None:
    ctx = ApplyContext(host=host, target=t, state={}, topic=secret.TOPIC)
    for step in steps:
        for action in step.actions:
            secret.TOPIC.executor_for(action)(ctx, action)


def test_the_secret_is_planned_created_0600_and_then_left_alone(host: Host) -> None:
    t = target()
    steps = plan(host, t)
    assert [s.id for s in steps] == ["secret.create"]
    shown = action_to_dict(steps[0].actions[0])  # what --dry-run and `plan --json` show
    assert shown["kind"] == "create-secret" and PATH in steps[0].actions[0].display()
    assert not host.path(PATH).exists()  # planning wrote nothing
    apply(host, t, steps)
    st = host.path(PATH).stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    key = auth.read_key_file(str(host.path(PATH))).key
    assert plan(host, t) == []  # idempotent
    assert auth.read_key_file(str(host.path(PATH))).key == key


def test_a_wide_mode_is_narrowed_without_a_new_key(host: Host) -> None:
    t = target()
    apply(host, t, plan(host, t))
    key = auth.read_key_file(str(host.path(PATH))).key
    os.chmod(host.path(PATH), 0o644)
    steps = plan(host, t)
    assert [s.id for s in steps] == ["secret.secure"] and not steps[0].destroys_data
    apply(host, t, steps)
    assert stat.S_IMODE(host.path(PATH).stat().st_mode) == 0o600
    assert auth.read_key_file(str(host.path(PATH))).key == key


def test_a_file_that_is_no_secret_is_replaced_only_with_force(host: Host) -> None:
    t = target()
    host.path(PATH).parent.mkdir(parents=True)
    fd = os.open(host.path(PATH), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"hunter2\n")
    os.close(fd)
    with pytest.raises(UsageError, match="not the rack secret"):
        plan(host, t)
    steps = plan(host, t, force_=True)
    assert [s.id for s in steps] == ["secret.replace"] and steps[0].destroys_data
    apply(host, t, steps)
    assert len(auth.read_key_file(str(host.path(PATH))).key) == auth.KEY_BYTES


def test_a_link_at_the_path_is_never_written_through(host: Host, tmp_path: Path) -> None:
    t = target()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    host.path(PATH).parent.mkdir(parents=True)
    host.path(PATH).symlink_to(victim)
    with pytest.raises(UsageError, match="a link"):
        plan(host, t)
    apply(host, t, plan(host, t, force_=True))
    assert victim.read_text() == "precious\n" and not host.path(PATH).is_symlink()


def test_only_the_metadata_host_gets_one(host: Host) -> None:
    t = target(server="lab-2")
    assert plan(host, t) == []
    facts = SetupFacts(snapshot=None)  # type: ignore[arg-type]
    assert "metadata server's host only" in secret.plan(t, facts).notes[0]


def test_the_manifest_wants_a_secret_only_with_an_endpoint_beyond_loopback() -> None:
    assert lab_target("lab-1").secret is None  # the lab binds everything to loopback
    opened = lab_target("lab-1", edit={"admin_bind: 127.0.0.1": "admin_bind: 0.0.0.0"})
    assert opened.secret == secret.SecretTarget("/etc/belugactl/lab.secret", "root", "lab-1", "lab")
    moved = lab_target("lab-2", edit={"    admin_bind: 127.0.0.1\n": "    rpc_bind: 10.0.0.1\n    "
                                      "secret_file: /srv/rack.key\n"})  # fmt: skip
    assert moved.secret is not None and moved.secret.path == "/srv/rack.key" and moved.secret.server_host == "lab-1"


def test_setup_plans_the_secret_on_the_metadata_host(lab1) -> None:
    from belugactl.workflows.setup.applier import run_setup

    opened = lab_target("lab-1", edit={"admin_bind: 127.0.0.1": "admin_bind: 0.0.0.0"})
    plan = run_setup(lab1.host, opened, dry_run=True).initial
    step = next(s for s in plan.steps if s.topic == "secret")
    assert step.id == "secret.create" and "/etc/belugactl/lab.secret" in step.actions[0].display()
    assert not lab1.host.path("/etc/belugactl/lab.secret").exists()  # a dry run writes nothing
