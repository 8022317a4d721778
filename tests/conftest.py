"""Fixtures shared across test folders. Helpers live in tests.support and are imported explicitly;
a folder's own conftest.py adds fixtures only that folder uses.

- a small two-host rack manifest and a file pool made from it (pool, data-plane tests)
- fake machines `lab1` and `lab2` sharing one pool file (setup tests, `belugactl setup` CLI tests)
- `pmem_pair`: two lab guests set up once for the lab tests that share them (tests/support/pmem_pair.py),
  run one after the other
- the tiers' rules for the whole run, plugins/ included (tests/support/tiers.py): `native` skips or
  fails in CI without the helper, `process` marks and guards tests that start processes, and the
  seconds per tier at the end
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_machine import FakeMachine
from tests.support.pmem_pair import PmemPair, run_users_together, start_pmem_pair
from tests.support.small_rack import SMALL_RACK
from tests.support.tiers import TierPlugin


def pytest_configure(config: pytest.Config) -> None:
    # Output is rendered as piped whatever runs the tests: a COLUMNS from the shell or from a test
    # runner's worker (pytest-xdist's has COLUMNS=80) would wrap the lines tests read.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    # A plugin, not this conftest's own hooks: those would reach only the tests below tests/.
    if not config.pluginmanager.has_plugin("belugactl-tiers"):
        config.pluginmanager.register(TierPlugin(), "belugactl-tiers")


@pytest.fixture
def rack_text() -> str:
    return SMALL_RACK


@pytest.fixture
def manifest_path(tmp_path: Path) -> Path:
    path = tmp_path / "rack.yaml"
    path.write_text(SMALL_RACK)
    return path


@pytest.fixture
def manifest(manifest_path: Path):
    from belugactl.model.manifest import load_manifest

    return load_manifest(manifest_path)


@pytest.fixture
def pool_path(tmp_path: Path, manifest) -> Path:
    from belugactl.pool.file_pool import create_file_pool

    return create_file_pool(tmp_path / "pool.bin", manifest)


@pytest.fixture
def pool_file(tmp_path: Path) -> Path:
    return tmp_path / "pool.raw"


@pytest.fixture
def lab1(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-1", pool_file, hostname="lab-1")


@pytest.fixture
def lab2(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-2", pool_file, hostname="lab-2")


@pytest.fixture(scope="session")
def pmem_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PmemPair]:
    """Two pmem guests with `belugactl setup` done on both (tests/support/pmem_pair.py)."""
    yield from start_pmem_pair(tmp_path_factory.mktemp("pmem-pair"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    run_users_together(items, "pmem_pair")
