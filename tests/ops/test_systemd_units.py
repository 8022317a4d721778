"""`export systemd` writes both boot units: the pool unit and the serve unit it orders itself before,
checked by systemd's own `systemd-analyze verify` (where installed) and by parsing them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.cli.app import run

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"


def _sections(text: str) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return out


@pytest.fixture
def units(tmp_path: Path) -> Path:
    code = run(["export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", str(tmp_path),
                "--command", f"{sys.executable} -m belugactl"])  # fmt: skip
    assert code in (0, None)
    return tmp_path


def test_serve_unit_runs_serve_after_the_pool_unit_and_only_if_it_succeeded(units: Path) -> None:
    setup = _sections((units / "belugactl-setup.service").read_text())
    serve = _sections((units / "belugactl-serve.service").read_text())
    assert setup["Unit"]["Before"] == ["belugactl-serve.service"]
    assert "belugactl-setup.service" in serve["Unit"]["After"][0].split()
    assert serve["Unit"]["Requires"] == ["belugactl-setup.service"]
    assert serve["Service"]["ExecStart"] == [
        f"{sys.executable} -m belugactl serve -f {LAB} --host lab-1 --run-dir /run/belugactl/serve"
    ]
    # systemd signals the supervisor alone; it drains the router and stops vLLM and the server in order
    assert serve["Service"]["KillMode"] == ["mixed"]
    assert serve["Install"]["WantedBy"] == ["multi-user.target"]


def test_no_unit_points_at_documentation_that_does_not_exist(units: Path) -> None:
    for name in ("belugactl-setup.service", "belugactl-serve.service"):
        assert "man:" not in (units / name).read_text()


def test_output_file_keeps_its_name_and_the_serve_unit_goes_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "pool-boot.service"
    assert run(["export", "systemd", "-f", str(LAB), "--host", "lab-2", "-o", str(target)]) in (0, None)
    assert "setup -f" in target.read_text()
    assert "serve -f" in (tmp_path / "belugactl-serve.service").read_text()


def test_stdout_shows_both_units(capsys) -> None:
    assert run(["export", "systemd", "-f", str(LAB), "--host", "lab-2"]) in (0, None)
    out = capsys.readouterr().out
    assert "# ---- belugactl-setup.service" in out and "# ---- belugactl-serve.service" in out


@pytest.mark.process
def test_systemd_analyze_verify_accepts_both_units(units: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the units are still parsed by the tests above)")
    files = [str(units / "belugactl-setup.service"), str(units / "belugactl-serve.service")]
    checked = subprocess.run([analyze, "verify", *files], capture_output=True, text=True, timeout=60)
    # verify exits 0 on some warnings (an unknown KillMode, say) and prints them: none are allowed
    assert checked.returncode == 0 and checked.stderr.strip() == "", checked.stderr
