"""The connector's stats file is written off the counting thread: once the counters are still (the
request that changed them is past its critical path), or after max_delay_s of steady change, and at
most every min_interval_s."""

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


@pytest.fixture
def writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each stats file under tmp_path was written (renamed into place)."""
    at: list[float] = []
    real_replace = stats_mod.os.replace

    def replace(src, dst):  # noqa: ANN001
        if Path(dst).parent == tmp_path:  # not a writer thread left by an earlier test
            at.append(time.monotonic())
        real_replace(src, dst)

    monkeypatch.setattr(stats_mod.os, "replace", replace)
    return at


def test_writes_are_rate_limited(tmp_path: Path, writes: list[float]) -> None:
    # Steady counting, never still: written every max_delay_s, and never more often than min_interval_s.
    stats = ConnectorStats(str(tmp_path / "w"), role="worker0", min_interval_s=0.2, quiet_s=10, max_delay_s=0.05)
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        stats.add("loaded_blocks")
        time.sleep(0.001)
    counting = list(writes)
    assert _wait_for(lambda: json.loads((tmp_path / "w.worker0.json").read_text())["counters"]["loaded_blocks"] > 0)
    # ~1 s of counting at one write per 0.2 s at most: about 5 writes, never one per add
    assert 2 <= len(counting) <= 6, counting
    gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)]
    assert all(g >= 0.19 for g in gaps), gaps


def test_a_write_waits_until_the_counters_are_still(tmp_path: Path, writes: list[float]) -> None:
    stats = ConnectorStats(str(tmp_path / "s"), role="scheduler", min_interval_s=0.01, quiet_s=0.15, max_delay_s=30)
    started = time.monotonic()
    while time.monotonic() - started < 0.5:  # a burst of changes 5 ms apart: never still for 0.15 s
        stats.add("lookups")
        time.sleep(0.005)
    last_change = time.monotonic()
    assert _wait_for(lambda: bool(writes))
    assert writes[0] - last_change >= 0.14, writes[0] - last_change  # nothing written during the burst
    assert json.loads((tmp_path / "s.scheduler.json").read_text())["counters"]["lookups"] == stats.get("lookups")
    assert stats.due(time.monotonic()) is False  # written, nothing new


def test_state_changes_are_written_at_once(tmp_path: Path) -> None:
    stats = ConnectorStats(str(tmp_path / "v"), role="worker1", min_interval_s=10)
    stats.set("healthy", False)
    doc = json.loads((tmp_path / "v.worker1.json").read_text())
    assert doc["healthy"] is False and doc["role"] == "worker1"


def test_no_path_no_thread() -> None:
    stats = ConnectorStats(None, role="scheduler")
    stats.add("lookups")
    assert stats.get("lookups") == 1 and stats._writer is None


def test_concurrent_flushes_never_leave_a_torn_file(tmp_path: Path) -> None:
    """The writer thread and a thread that sets state (a ring error, an address) may flush at the
    same moment; each write must land whole, never one document over the tail of another (CI once
    read `{...}"worker0", ...}` from a worker's file)."""
    stats = ConnectorStats(str(tmp_path / "v"), role="worker0", min_interval_s=10)
    path = tmp_path / "v.worker0.json"
    stop = threading.Event()
    torn: list[str] = []

    def writer(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            # Documents of different lengths, so an overlap of two writes shows as trailing bytes.
            stats.set(f"note{n}", "x" * (i % 97))
            stats.add("loads")
            stats.flush()

    def reader() -> None:
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join()
    assert not torn, torn[0]
    assert json.loads(path.read_text())["counters"]["loads"] == stats.get("loads")
