"""A pool whose header was written by the per-instance ring layout (before a ring per process): serve
refuses it with exit 2, says the layout changed, and says how to fix it and what that destroys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.errors import PoolMismatch
from belugactl.model.layout import legacy_layout
from belugactl.model.manifest import load_manifest
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping

REPO = Path(__file__).resolve().parents[2]
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"


@pytest.fixture
def old_pool(tmp_path: Path) -> Path:
    manifest = load_manifest(CPU_DEMO)
    return create_file_pool(tmp_path / "old.pool", manifest, layout=legacy_layout(manifest))


def test_mapping_the_old_pool_says_the_layout_changed(old_pool: Path) -> None:
    with pytest.raises(PoolMismatch) as caught:
        PoolMapping.open(old_pool, load_manifest(CPU_DEMO), writable=False)
    err = caught.value
    assert "the pool layout changed" in err.what and "older belugactl" in err.what
    assert "one CXL-RPC ring (4 rings)" in err.what and "6 (4 vLLM processes + 2 spare)" in err.what
    assert "rpc_ring_count: manifest 6, pool 4" in (err.why or "")
    # a file pool is re-created, not re-set-up; the fix says what that destroys
    assert f"remove {old_pool}" in err.fix and "pool create-file" in err.fix
    assert "DESTROYS the pool's contents" in err.fix and "every cached KV block" in err.fix
    assert "use the manifest the pool was set up with" not in err.fix


def test_serve_refuses_the_old_pool_with_exit_2(old_pool: Path) -> None:
    from belugactl.errors import ExitCode
    from belugactl.workflows.rack_context import load_rack_context
    from belugactl.workflows.serve.preflight import check_pool

    rack = load_rack_context(CPU_DEMO, host="cpu-demo", pool=str(old_pool))
    with pytest.raises(PoolMismatch) as caught:
        check_pool(str(old_pool), rack)  # what serve checks before it starts anything
    assert caught.value.exit_code == ExitCode.USAGE == 2
    assert "the pool layout changed" in caught.value.what


@pytest.mark.process
def test_pool_inspect_cli_reports_the_old_pool_without_a_traceback(old_pool: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "belugactl", "pool", "inspect", str(old_pool), "-f", str(CPU_DEMO),
         "--admin", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a header that differs from the manifest is a finding (issue 34)
    assert "Traceback" not in proc.stderr
    assert "DIFFERS from cpu-demo" in proc.stdout and "rpc_ring_count: manifest 6, pool 4" in proc.stdout


def test_setup_names_the_ring_count_in_its_refusal() -> None:
    from belugactl.workflows.setup.topics.header import HeaderMismatch

    err = HeaderMismatch("/dev/dax0.0", [("layout_hash", "aa", "bb"), ("rpc_ring_count", 6, 4)])
    assert "it has 4 CXL-RPC rings where this manifest needs 6 (one per vLLM process)" in err.what
    assert "older belugactl" in err.what and "--force" in err.fix


def test_a_refused_header_says_what_the_operator_changed_and_what_force_drops() -> None:
    """Hosts added, removed or renamed and a ring count, named from the two headers (setup's refusal)."""
    from dataclasses import replace

    from belugactl.model.layout import resolve_layout
    from belugactl.pool import header as hdr
    from belugactl.workflows.setup.topics.header import HeaderMismatch

    manifest = load_manifest(CPU_DEMO)
    theirs = hdr.PoolHeader.from_layout(manifest, resolve_layout(manifest), created_by="a")
    assert hdr.describe_change(theirs, theirs) == []
    renamed = replace(theirs, hosts=(replace(theirs.hosts[0], name="gpu-new"), *theirs.hosts[1:]))
    change = hdr.describe_change(renamed, theirs)
    assert change == ["host(s) added: gpu-new", f"host(s) removed: {theirs.hosts[0].name}"], change
    older = hdr.PoolHeader.from_layout(manifest, legacy_layout(manifest), created_by="a")
    assert any(c.startswith("CXL-RPC rings ") for c in hdr.describe_change(theirs, older))
    err = HeaderMismatch("/dev/dax0.0", hdr.diff(renamed, theirs), change)
    assert "what changed: host(s) added: gpu-new; host(s) removed" in err.what
    assert "every cached KV block is dropped" in err.why and err.to_dict()["change"] == change
