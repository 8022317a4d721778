"""The plugin tests' fixtures: the vLLM venv for the tests that need one (`vllm` marker; in CI a missing
vLLM venv fails them, never skips), a real metadata server on the CPU demo's file pool, and the
`native` marker's rule (without the native helper: skipped with the reason; under CI=true: failed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mds_process import Mds, cpu_demo_mds

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
REPO = PLUGIN_ROOT.parents[1]


def pytest_runtest_setup(item: pytest.Item) -> None:
    from belugactl.dataplane import native

    if item.get_closest_marker("native") is None or native._native is not None:
        return
    message = "the native helper is not built (.venv/bin/pip install -e . --no-build-isolation)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI must build it and run these tests", pytrace=False)
    pytest.skip(message)


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
