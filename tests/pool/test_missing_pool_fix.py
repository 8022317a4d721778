"""A missing pool's fix names the manifest's real file, also when the caller holds a loaded Manifest
(issue 34 item 7: it printed `-f rack.yaml`, a placeholder, although the path was known)."""

from __future__ import annotations

import pytest

from belugactl.errors import ExitCode, PoolMissing
from belugactl.model.manifest import load_manifest, load_manifest_text, manifest_source
from belugactl.pool.mapping import PoolMapping
from tests.cli.conftest import invoke
from tests.support.paths import CPU_DEMO


def test_a_loaded_manifest_knows_its_file_and_one_from_text_does_not():
    assert manifest_source(load_manifest(CPU_DEMO)) == CPU_DEMO
    assert manifest_source(load_manifest_text(CPU_DEMO.read_text())) is None


def test_the_fix_names_the_file_of_a_loaded_manifest(tmp_path):
    with pytest.raises(PoolMissing) as caught:
        PoolMapping.open(tmp_path / "missing.pool", load_manifest(CPU_DEMO))
    assert f"pool create-file -f {CPU_DEMO} " in caught.value.fix
    assert f"setup -f {CPU_DEMO}" in caught.value.fix
    assert "rack.yaml" not in caught.value.fix


def test_without_a_file_the_fix_keeps_the_readme_placeholder(tmp_path):
    with pytest.raises(PoolMissing) as caught:
        PoolMapping.open(tmp_path / "missing.pool", load_manifest_text(CPU_DEMO.read_text()))
    assert "pool create-file -f rack.yaml " in caught.value.fix


def test_pool_inspect_of_a_missing_pool_names_the_manifest_given(tmp_path):
    result = invoke("pool", "inspect", str(tmp_path / "missing.pool"), "-f", str(CPU_DEMO))
    assert result.code == ExitCode.ENVIRONMENT
    assert f"pool create-file -f {CPU_DEMO} " in result.stderr
    assert "-f rack.yaml" not in result.stderr
