"""The plugin tests' fixtures: the vLLM venv for the tests that need one (`vllm` marker; in CI a missing
vLLM venv fails them, never skips) and a real metadata server on the CPU demo's file pool."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mds_process import Mds, cpu_demo_mds

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
REPO = PLUGIN_ROOT.parents[1]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"the vLLM venv is missing ({python}); create it with scripts/bootstrap-vllm"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Mds]:
    """A metadata server on a fresh CPU-demo pool: `.tcp` its address, `.pool_path` the pool, `.proc`."""
    with cpu_demo_mds(tmp_path) as m:
        yield m
