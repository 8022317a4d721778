"""Find the vLLM venv for the tests that do (`vllm` marker; in CI a missing vLLM venv fails them, never skips)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
