"""A pool file is trusted only as far as its owner: a world-writable file, or one another user owns,
is refused (exit 2, what/why/fix) unless the manifest names that owner (pool.permissions.owner)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.errors import InputError
from belugactl.model.manifest import load_manifest
from belugactl.pool import mapping
from belugactl.pool.mapping import PoolMapping, check_pool_file_owner

NOBODY_UID = 65534
NOBODY = "http://127.0.0.1:9"


def _as_another_user(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` another user's file from this process's point of view (root: chown it; others:
    pretend to be a user who neither owns it nor is root)."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY_UID, -1)
    else:
        monkeypatch.setattr(mapping.os, "geteuid", lambda: 4242)


def test_a_world_writable_pool_file_is_refused(pool_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.chmod(pool_path, 0o666)
    with pytest.raises(InputError, match="world-writable"):
        PoolMapping.open(pool_path)
    assert run(["pool", "inspect", str(pool_path), "--admin", NOBODY]) == 2
    err = capsys.readouterr().err
    assert "world-writable (mode 0666)" in err and "chmod o-w" in err and "Traceback" not in err


def test_another_users_pool_file_is_refused(
    pool_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_another_user(pool_path, monkeypatch)
    with pytest.raises(InputError, match="belongs to"):
        PoolMapping.open(pool_path, writable=False)
    assert run(["pool", "inspect", str(pool_path), "--admin", NOBODY]) == 2
    err = capsys.readouterr().err
    assert "belongs to" in err and "pool.permissions.owner" in err and "Traceback" not in err


def test_the_manifest_can_name_the_owner_of_a_shared_file(tmp_path: Path, rack_text: str, pool_path: Path) -> None:
    st = os.stat(pool_path)
    shared = rack_text.replace("  align: 2MiB\n", f"  align: 2MiB\n  permissions: {{owner: '{NOBODY_UID}'}}\n")
    (tmp_path / "shared.yaml").write_text(shared)
    named = load_manifest(tmp_path / "shared.yaml")
    foreign = os.stat_result((st.st_mode, *st[1:4], NOBODY_UID, *st[5:]))
    check_pool_file_owner(pool_path, foreign, named, euid=0)  # named: accepted, also for root
    with pytest.raises(InputError, match="belongs to"):
        check_pool_file_owner(pool_path, foreign, load_manifest(tmp_path / "rack.yaml"), euid=0)
    with pytest.raises(InputError, match="belongs to"):
        check_pool_file_owner(pool_path, foreign, None, euid=1000)


def test_own_and_roots_files_pass(pool_path: Path) -> None:
    st = os.stat(pool_path)
    own = os.stat_result((st.st_mode, *st[1:4], 1000, *st[5:]))
    root = os.stat_result((st.st_mode, *st[1:4], 0, *st[5:]))
    check_pool_file_owner(pool_path, own, None, euid=1000)
    check_pool_file_owner(pool_path, root, None, euid=1000)
    PoolMapping.open(pool_path).close()
