"""The CLI: plan/setup --dry-run as JSON on a recorded tree, exit codes, export systemd."""

from __future__ import annotations

import json
from pathlib import Path

from belugactl.cli.app import run
from belugactl.host.command_runner import RecordingRunner
from belugactl.workflows.discover import discover
from tests.support.fake_machine import LAB, FakeMachine


def recorded_tree(machine: FakeMachine) -> Path:
    """Record the tool outputs discovery asks for into the tree, as `discover --capture` would."""
    recorder = RecordingRunner(machine.host.runner)
    machine.host.runner = recorder
    discover(machine.host)
    (machine.root / ".belugactl").mkdir(exist_ok=True)
    recorder.dump(machine.root / ".belugactl/commands.json")
    return machine.root


def test_plan_json_on_a_recorded_tree(lab1, capsys):
    root = recorded_tree(lab1)
    code = run(["plan", "-f", str(LAB), "--host", "lab-1", "--root", str(root), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["host"] == "lab-1" and doc["converged"] is False and doc["destroys_data"] is False
    first = doc["steps"][0]
    assert first["id"] == "region.create"
    assert first["actions"][0]["kind"] == "run"
    assert first["actions"][0]["argv"][:2] == ["cxl", "create-region"]
    assert [s["topic"] for s in doc["skipped"]] == ["ddio", "mtrr"]


def test_setup_dry_run_changes_nothing(lab1, capsys):
    root = recorded_tree(lab1)
    before = sorted(p.name for p in root.rglob("*"))
    code = run(["setup", "-f", str(LAB), "--host", "lab-1", "--root", str(root), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "cxl create-region -m -d decoder0.0" in out and "(after earlier steps)" in out
    assert sorted(p.name for p in root.rglob("*")) == before


def test_unknown_host_is_a_usage_error(lab1, capsys):
    code = run(["plan", "-f", str(LAB), "--host", "nope", "--root", str(recorded_tree(lab1))])
    assert code == 2
    assert "no host named 'nope'" in capsys.readouterr().err


def test_unknown_topic_is_a_usage_error(lab1, capsys):
    code = run(["setup", "-f", str(LAB), "--host", "lab-1", "--only", "dddio", "--root", str(recorded_tree(lab1))])
    assert code == 2
    assert "unknown topic(s) for --only: dddio" in capsys.readouterr().err


def test_export_systemd(tmp_path, capsys):
    unit = tmp_path / "belugactl-setup.service"
    code = run(["export", "systemd", "-f", str(LAB), "--host", "lab-2", "-o", str(unit),
                "--command", "/usr/bin/belugactl"])
    assert code == 0
    text = unit.read_text()
    assert "Type=oneshot" in text and "RemainAfterExit=yes" in text and "WantedBy=multi-user.target" in text
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_line == (
        f"ExecStart=/usr/bin/belugactl setup -f {LAB} --host lab-2 "
        "--only autoonline,permissions,hugepages,thp,ddio,mtrr --yes --wait-devices 60"
    )


def test_host_defaults_to_the_manifest_entry_matching_the_hostname(monkeypatch):
    import socket

    from belugactl.errors import UsageError
    from belugactl.model.manifest import load_manifest
    from belugactl.workflows.setup.target import default_host_name

    manifest = load_manifest(LAB)
    monkeypatch.setattr(socket, "gethostname", lambda: "lab-2.example.net")
    assert default_host_name(manifest) == "lab-2"
    monkeypatch.setattr(socket, "gethostname", lambda: "elsewhere")
    try:
        default_host_name(manifest)
    except UsageError as exc:
        assert "lab-1, lab-2" in exc.why and exc.fix == "pass --host NAME"
    else:
        raise AssertionError("an unknown hostname must be refused")


def test_host_tuning_overrides_the_rack_field_by_field():
    from tests.support.fake_machine import lab_target

    # lab-2 (the last host) gets its own THP; the rack's hugepages still apply to it.
    anchor = "    gpus: {count: 0}\n\ntuning:"
    edit = {anchor: "    gpus: {count: 0}\n    tuning: {thp: never}\n\ntuning:"}
    lab2 = lab_target("lab-2", edit=edit)
    assert lab2.thp == "never" and lab2.hugepages == {0: 64}
    assert lab_target("lab-1", edit=edit).thp == "madvise"
