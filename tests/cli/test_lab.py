"""`belugactl lab` argument handling and exit codes that need no QEMU."""

import json

import pytest

from belugactl.cli import app as app_module
from belugactl.lab import prereqs
from belugactl.lab.paths import STATE_ENV


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


def test_exec_without_a_command_is_a_usage_error(capsys):
    assert app_module.run(["lab", "exec", "lab-1", "--"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_exec_into_a_lab_that_is_not_up_says_how_to_start_it(capsys):
    assert app_module.run(["lab", "exec", "lab-1", "--", "true"]) == 3
    assert "belugactl lab up" in capsys.readouterr().err


def test_status_of_no_lab_is_down_and_succeeds(capsys):
    assert app_module.run(["lab", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "down"


def test_down_of_no_lab_is_a_no_op(capsys):
    assert app_module.run(["lab", "down"]) == 0
    assert "nothing to take down" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [["--pool-size", "100MiB"], ["--pool-size", "8GiB"], ["--count", "0"], ["--accel", "hvf"], ["--name", "a/b"]],
)
def test_up_rejects_bad_arguments_before_touching_anything(args, state, capsys):
    assert app_module.run(["lab", "up", *args]) == 2
    assert not state.exists() or not any(state.rglob("*.raw"))
    assert capsys.readouterr().err.startswith("error:")


def test_up_without_qemu_names_the_packages(monkeypatch, capsys):
    monkeypatch.setattr(prereqs, "find_program", lambda name: None)
    assert app_module.run(["lab", "up", "--profile", "pmem"]) == 3
    err = capsys.readouterr().err
    assert "qemu-system-x86" in err and "apt-get install" in err
