from __future__ import annotations

from pathlib import Path

import pytest
from setup_fakehost import FakeMachine


@pytest.fixture
def pool_file(tmp_path: Path) -> Path:
    return tmp_path / "pool.raw"


@pytest.fixture
def lab1(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-1", pool_file, hostname="lab-1")


@pytest.fixture
def lab2(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-2", pool_file, hostname="lab-2")
