"""What a slow test needs from the machine (a vLLM venv, haproxy, prometheus): skipped with the reason
where it is missing, failed under CI=true, where `scripts/bootstrap` must have installed it."""

from __future__ import annotations

import os

import pytest


def need(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
