from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.target import SetupTarget, target_from_manifest
from tests.setup.fakehost import FakeMachine

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab.yaml"


def lab_target(host: str = "lab-1", *, edit: dict[str, str] | None = None) -> SetupTarget:
    """The lab example manifest, optionally with text replacements (each must apply)."""
    text = LAB.read_text()
    for old, new in (edit or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    manifest = load_manifest_text(text, file="lab.yaml")
    return target_from_manifest(manifest, host, layout=resolve_layout(manifest))


@pytest.fixture
def pool_file(tmp_path: Path) -> Path:
    return tmp_path / "pool.raw"


@pytest.fixture
def lab1(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-1", pool_file, hostname="lab-1")


@pytest.fixture
def lab2(tmp_path: Path, pool_file: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "lab-2", pool_file, hostname="lab-2")
