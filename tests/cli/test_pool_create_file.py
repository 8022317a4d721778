"""`belugactl pool create-file`: creates a verified file pool, never rewrites an existing one."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "belugactl", "pool", "create-file", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_create_then_refuse_then_verify(tmp_path):
    pool = tmp_path / "p.pool"
    first = _run("-f", "examples/cpu-demo.yaml", str(pool))
    assert first.returncode == 0, first.stderr
    assert pool.stat().st_size == 1 << 30
    again = _run("-f", "examples/cpu-demo.yaml", str(pool))
    assert again.returncode == 2 and "already exists" in again.stderr
    kept = _run("-f", "examples/cpu-demo.yaml", str(pool), "--exist-ok")
    assert kept.returncode == 0


def test_exist_ok_never_rewrites_a_pool_of_another_manifest(tmp_path):
    pool = tmp_path / "p.pool"
    assert _run("-f", "examples/cpu-demo.yaml", str(pool)).returncode == 0
    before = pool.read_bytes()[:4096]
    other = _run("-f", "examples/lab.yaml", str(pool), "--exist-ok")
    assert other.returncode == 2
    assert "different manifest" in other.stderr and "Traceback" not in other.stderr
    assert pool.read_bytes()[:4096] == before
