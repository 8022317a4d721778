"""`belugactl pool create-file`: creates a verified file pool, never rewrites an existing one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "belugactl", "pool", "create-file", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.process
def test_create_then_refuse_then_verify(tmp_path):
    pool = tmp_path / "p.pool"
    first = _run("-f", "examples/cpu-demo.yaml", str(pool))
    assert first.returncode == 0, first.stderr
    assert pool.stat().st_size == 1 << 30
    again = _run("-f", "examples/cpu-demo.yaml", str(pool))
    assert again.returncode == 2 and "already exists" in again.stderr
    kept = _run("-f", "examples/cpu-demo.yaml", str(pool), "--exist-ok")
    assert kept.returncode == 0


@pytest.mark.process
def test_exist_ok_never_rewrites_a_pool_of_another_manifest(tmp_path):
    pool = tmp_path / "p.pool"
    assert _run("-f", "examples/cpu-demo.yaml", str(pool)).returncode == 0
    before = pool.read_bytes()[:4096]
    other = _run("-f", "examples/lab.yaml", str(pool), "--exist-ok")
    assert other.returncode == 2
    assert "different manifest" in other.stderr and "Traceback" not in other.stderr
    assert pool.read_bytes()[:4096] == before


def _small_disk(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """statvfs reports `free` bytes available, as on a nearly full file system (the real one may have room)."""
    real = os.statvfs

    class Small:
        def __init__(self, st: os.statvfs_result) -> None:
            self._st = st
            self.f_frsize = 4096
            self.f_bavail = free // 4096

        def __getattr__(self, name: str) -> object:
            return getattr(self._st, name)

    monkeypatch.setattr(os, "statvfs", lambda p: Small(real(p)))


def test_a_pool_larger_than_the_free_space_needs_yes(cli, tmp_path, monkeypatch):
    pool = tmp_path / "p.pool"
    _small_disk(monkeypatch, 256 << 20)  # the CPU demo's pool is 1 GiB
    refused = cli("pool", "create-file", "-f", str(ROOT / "examples/cpu-demo.yaml"), str(pool))
    assert refused.code == 2
    assert "larger than the free space" in refused.stderr and "--yes" in refused.stderr
    assert not pool.exists()
    forced = cli("pool", "create-file", "-f", str(ROOT / "examples/cpu-demo.yaml"), str(pool), "--yes")
    assert forced.code == 0, forced.stderr
    assert "warning" in forced.stderr and "larger than the free space" in forced.stderr
    assert pool.stat().st_size == 1 << 30


def test_a_pool_that_fits_needs_no_yes(cli, tmp_path, monkeypatch):
    pool = tmp_path / "p.pool"
    _small_disk(monkeypatch, 2 << 30)
    done = cli("pool", "create-file", "-f", str(ROOT / "examples/cpu-demo.yaml"), str(pool))
    assert done.code == 0, done.stderr
    assert "warning" not in done.stderr


def test_readme_puts_no_pool_in_tmp():
    """`pool create-file --help` says not to put a pool in a shared /tmp; the README's commands agree."""
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            bad = re.search(r"(--pool|create-file\b.*)\s+/tmp/", line)
            assert bad is None, f"{doc.relative_to(ROOT)}:{number}: a pool path in /tmp: {line.strip()}"
