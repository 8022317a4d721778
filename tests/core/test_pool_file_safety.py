"""A pool file holds every tenant's KV bytes: created new, never through a symlink, private by default."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.errors import PoolMismatch
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.pool.file_pool import create_file_pool

ROOT = Path(__file__).resolve().parents[2]
CPU_DEMO = ROOT / "examples" / "cpu-demo.yaml"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "belugactl", "pool", "create-file", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.process
def test_dangling_symlink_at_the_path_is_refused_and_not_followed(tmp_path):
    victim = tmp_path / "victim-file"
    link = tmp_path / "beluga.pool"
    link.symlink_to(victim)
    proc = _cli("-f", str(CPU_DEMO), str(link))
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert not victim.exists()
    with pytest.raises(PoolMismatch, match="symbolic link"):
        create_file_pool(link, CPU_DEMO)
    assert not victim.exists()


@pytest.mark.process
def test_symlink_to_an_existing_pool_is_refused_even_with_exist_ok(tmp_path):
    real = create_file_pool(tmp_path / "real.pool", CPU_DEMO)
    link = tmp_path / "link.pool"
    link.symlink_to(real)
    proc = _cli("-f", str(CPU_DEMO), str(link), "--exist-ok")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr
    with pytest.raises(PoolMismatch, match="symbolic link"):
        create_file_pool(link, CPU_DEMO, exist_ok=True)


@pytest.mark.process
def test_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        pool = create_file_pool(tmp_path / "p.pool", CPU_DEMO)
    finally:
        os.umask(old)
    assert stat.S_IMODE(pool.stat().st_mode) == 0o600
    proc = _cli("-f", str(CPU_DEMO), str(tmp_path / "cli.pool"))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "cli.pool").stat().st_mode) == 0o600


def test_manifest_permissions_mode_is_used_when_set(tmp_path):
    text = CPU_DEMO.read_text()
    assert "permissions" not in text
    text = text.replace("  align: 2MiB\n", '  align: 2MiB\n  permissions: {mode: "0640"}\n', 1)
    manifest = load_manifest_text(text)
    pool = create_file_pool(tmp_path / "p.pool", manifest)
    assert stat.S_IMODE(pool.stat().st_mode) == 0o640


def test_a_file_that_appears_first_is_never_overwritten(tmp_path, monkeypatch):
    # The path is checked, then created with O_EXCL: a file planted in between makes creation fail.
    target = tmp_path / "p.pool"
    real_lstat = os.lstat

    def planting_lstat(path, *args, **kwargs):
        try:
            return real_lstat(path, *args, **kwargs)  # FileNotFoundError: the path looks free
        finally:
            if Path(path) == target and not target.exists():
                target.write_bytes(b"someone else's")

    monkeypatch.setattr(os, "lstat", planting_lstat)
    with pytest.raises(PoolMismatch, match="appeared"):
        create_file_pool(target, load_manifest(CPU_DEMO))
    monkeypatch.undo()
    assert target.read_bytes() == b"someone else's"
