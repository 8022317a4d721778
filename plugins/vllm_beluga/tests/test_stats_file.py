"""The connector's stats file is written off the counting thread, at most every min_interval_s."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from vllm_beluga import stats as stats_mod
from vllm_beluga.stats import ConnectorStats


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_counting_never_writes_on_the_counting_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writers: list[str] = []
    real_replace = stats_mod.os.replace

    def replace(src, dst):  # noqa: ANN001 - os.replace's own signature
        writers.append(threading.current_thread().name)
        real_replace(src, dst)

    monkeypatch.setattr(stats_mod.os, "replace", replace)
    stats = ConnectorStats(str(tmp_path / "vllm-0"), role="scheduler", min_interval_s=0.05)
    for _ in range(200):
        stats.add("lookups")
        stats.add("lookup_us", 7)
    path = tmp_path / "vllm-0.scheduler.json"

    def complete() -> bool:
        try:
            return json.loads(path.read_text())["counters"].get("lookups") == 200
        except (OSError, ValueError):
            return False

    assert _wait_for(complete)  # every count reaches the file shortly after the last one
    assert writers and set(writers) == {"beluga-stats-scheduler"}
    assert json.loads(path.read_text())["counters"]["lookup_us"] == 1400


def test_writes_are_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[float] = []
    real_replace = stats_mod.os.replace

    def replace(src, dst):  # noqa: ANN001
        writes.append(time.monotonic())
        real_replace(src, dst)

    monkeypatch.setattr(stats_mod.os, "replace", replace)
    stats = ConnectorStats(str(tmp_path / "w"), role="worker0", min_interval_s=0.2)
    started = time.monotonic()
    while time.monotonic() - started < 0.7:
        stats.add("loaded_blocks")
        time.sleep(0.001)
    assert _wait_for(lambda: json.loads((tmp_path / "w.worker0.json").read_text())["counters"]["loaded_blocks"] > 0)
    time.sleep(0.3)
    # ~0.7 s of counting at one write per 0.2 s at most: 5 writes, never one per add
    assert 1 <= len(writes) <= 6
    gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)]
    assert all(g >= 0.19 for g in gaps), gaps


def test_state_changes_are_written_at_once(tmp_path: Path) -> None:
    stats = ConnectorStats(str(tmp_path / "v"), role="worker1", min_interval_s=10)
    stats.set("healthy", False)
    doc = json.loads((tmp_path / "v.worker1.json").read_text())
    assert doc["healthy"] is False and doc["role"] == "worker1"


def test_no_path_no_thread() -> None:
    stats = ConnectorStats(None, role="scheduler")
    stats.add("lookups")
    assert stats.get("lookups") == 1 and stats._writer is None
