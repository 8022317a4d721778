"""Whether a mapping flushes: a manifest-less client (cxl:///dev/daxX.Y#N) must decide as the server does.

Found by the cross-host lab test (test_rpc_lab.py): a client opened with only the pool path mapped a
write-back devdax pool shared by two hosts with `needs_flush` False, so on hardware its requests and
reads would have skipped the cache-line flushes. The header's host table now answers "shared?".
A devdax device cannot be made here; `_is_devdax` is the one hardware fact stood in for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.model.manifest import load_manifest
from belugactl.pool import mapping as pool_mod
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping


@pytest.fixture
def as_devdax(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod, "_is_devdax", lambda path: True)


def test_a_pool_of_two_hosts_needs_flushes_with_or_without_the_manifest(pool_path: Path, manifest, as_devdax) -> None:
    assert len(manifest.hosts) == 2 and manifest.caching.pool_memory_type == "write-back"
    with PoolMapping.open(pool_path, manifest) as pool:
        assert pool.is_devdax and pool.needs_flush
    with PoolMapping.open(pool_path) as pool:
        assert pool.layout is None and len(pool.header.hosts) == 2
        assert pool.needs_flush


def test_a_pool_of_one_host_needs_none(tmp_path: Path, rack_text: str, as_devdax) -> None:
    one = rack_text[: rack_text.index("  - name: h1")] + rack_text[rack_text.index("serve:") :]
    path = tmp_path / "one.yaml"
    path.write_text(one)
    manifest = load_manifest(path)
    assert len(manifest.hosts) == 1
    pool_path = create_file_pool(tmp_path / "pool.bin", manifest)
    for m in (manifest, None):
        with PoolMapping.open(pool_path, m) as pool:
            assert pool.is_devdax and not pool.needs_flush


def test_a_file_pool_never_needs_flushes(pool_path: Path) -> None:
    with PoolMapping.open(pool_path) as pool:
        assert not pool.is_devdax and not pool.needs_flush
