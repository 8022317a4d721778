"""Setup topic `secret`: the rack secret on the metadata host, planned (dry-run shows it), created
0600, idempotent, narrowed when too wide, and never replaced without --force."""

from __future__ import annotations

import os
import stat
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
    t = lab_target("lab-1")
    # SetupTarget.secret: set by target_from_manifest once target.py carries it (secret.secret_target)
    object.__setattr__(t, "secret", secret.SecretTarget(PATH, str(os.geteuid()), server, "lab"))
    return t


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


def test_the_manifest_names_the_path_and_the_owner() -> None:
    from belugactl.model.manifest import load_manifest_text
    from tests.support.fake_machine import LAB

    m = load_manifest_text(LAB.read_text(), file="lab.yaml")
    want = secret.secret_target(m)
    assert want.path == f"/etc/belugactl/{m.name}.secret" and want.owner == m.pool.permissions.owner
