"""examples/ansible/belugactl.yml run for real by ansible-playbook against this machine.

The one stand-in is at the hardware boundary: `belugactl` reads the lab-guest fixture tree
(`--root`) instead of this machine, which has no CXL.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "examples" / "ansible" / "belugactl.yml"


def _ansible_playbook() -> str:
    found = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ansible-playbook is missing: scripts/bootstrap installs ansible-core with the test extras")
        pytest.skip("ansible-playbook is not installed (pip install ansible-core)")
    return found


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    wrapper = tmp_path / "belugactl"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -m belugactl \"$@\" --root {ROOT / 'tests' / 'fixtures' / 'lab-guest'}\n"
    )
    wrapper.chmod(0o755)
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[beluga]\nlab-1 ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ans"),
               ANSIBLE_HOME=str(tmp_path / "ans"), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [_ansible_playbook(), "-i", str(inventory), str(PLAYBOOK),
         "-e", f"belugactl={wrapper}", "-e", f"belugactl_manifest={tmp_path / 'etc' / 'rack.yaml'}",
         "-e", f"belugactl_manifest_src={ROOT / 'examples' / 'lab.yaml'}", "-e", '{"ansible_become": false}', *extra],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )


def _task_results(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Task name -> the text ansible-playbook printed under it (default callback, -v)."""
    sections = re.split(r"^TASK \[(.+?)\] \**$", proc.stdout, flags=re.M)
    return {name: body for name, body in zip(sections[1::2], sections[2::2], strict=True)}


def test_check_mode_plans_through_setup_dry_run_and_runs_doctor(tmp_path):
    proc = _run(tmp_path, "--check", "-v")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    tasks = _task_results(proc)
    setup = tasks["belugactl setup"]
    # the fixture has no /dev/dax0.0 node: the header step is left to do, so "would change"
    assert setup.lstrip().startswith("changed: [lab-1]")
    assert '"--dry-run"' in setup and '"--force"' not in setup
    assert '"header.write-or-verify"' in tasks["What setup did (or, with --check, would do)"]
    assert '"msg": []' in tasks["Failed checks"]
    assert "failed=0" in proc.stdout
    assert (tmp_path / "etc" / "rack.yaml").read_text() == (ROOT / "examples" / "lab.yaml").read_text()
