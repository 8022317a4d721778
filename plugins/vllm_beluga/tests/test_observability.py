"""The connector's vLLM stats class (aggregate, reduce, Prometheus) and its KV-event bookkeeping,
with vLLM's real types: observability_driver.py runs inside the vLLM venv (no engine)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]
CHECKS = [
    "stats_interval_and_aggregate",
    "prometheus_counters_and_histograms",
    "commit_observer_reports_only_committed_keys",
    "stored_events_wait_for_every_rank_and_carry_tokens",
    "removals_follow_the_cursor_and_restart_with_the_server",
]


def test_stats_and_events_with_vllm_types(vllm_python: Path) -> None:
    # This checkout's code, not whatever the venv has installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins" / "vllm_beluga")])}
    driver = subprocess.run(  # noqa: S603
        [str(vllm_python), str(Path(__file__).with_name("observability_driver.py"))],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    lines = [x for x in driver.stdout.splitlines() if x.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, driver.stderr[-4000:]
    assert json.loads(lines[-1].removeprefix("RESULT "))["passed"] == CHECKS
