"""`belugactl doctor` through the CLI: exit codes, --json, --ignore, --list, and this live machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.workflows.doctor import builtin_registry

REPO = Path(__file__).resolve().parents[2]


def _belugactl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.mark.process
def test_live_machine_runs_cleanly_without_a_traceback():
    proc = _belugactl("doctor")
    assert proc.returncode in (0, 1, 3), proc.stderr  # 3: this machine has no CXL, nothing to check
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "Summary:" in proc.stdout
    for check_id in builtin_registry().ids:
        assert check_id in proc.stdout


@pytest.mark.process
def test_live_machine_json_lists_every_check_and_matches_the_exit_code():
    proc = _belugactl("doctor", "--json")
    assert proc.returncode in (0, 1, 3), proc.stderr
    data = json.loads(proc.stdout)
    assert [c["id"] for c in data["checks"]] == builtin_registry().ids
    for check in data["checks"]:
        assert check["status"] in ("ok", "warn", "fail", "skip")
        assert check["reason"]
        if check["status"] in ("ok", "skip"):
            assert check["fix"] is None
    assert proc.returncode == (1 if data["summary"]["fail"] else 0 if data["has_cxl"] else 3)
    if not Path("/sys/bus/cxl").exists():
        # this development machine has no CXL: the CXL checks say so, one by one
        no_cxl = [c for c in data["checks"] if c["status"] == "skip" and "no CXL" in c["reason"]]
        assert {c["id"] for c in no_cxl} >= {"cxl.memdevs-present", "dax.mode-devdax", "numa.cxl-node-cpuless"}


def test_unknown_ignore_exits_2_with_did_you_mean(capsys):
    assert run(["doctor", "--ignore", "thp.mod"]) == 2
    err = capsys.readouterr().err
    assert "did you mean thp.mode" in err
    assert "Traceback" not in err


def test_host_without_manifest_and_missing_manifest_exit_2(capsys, tmp_path):
    assert run(["doctor", "--host", "lab-1"]) == 2
    assert "--host needs a manifest" in capsys.readouterr().err
    assert run(["doctor", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_list_prints_every_check(capsys):
    assert run(["doctor", "--list"]) == 0
    out = capsys.readouterr().out
    for check_id in builtin_registry().ids:
        assert check_id in out
    assert run(["doctor", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed["checks"]] == builtin_registry().ids


def test_root_that_does_not_exist_exits_2(capsys, tmp_path):
    assert run(["doctor", "--root", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
