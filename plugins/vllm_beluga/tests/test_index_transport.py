"""The best-effort index never switches a process from its ring to TCP by itself."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.stats import ConnectorStats


class _Client:
    """A fake KVIndexClient: the counters the index reads, and a LOOKUP_PREFIX that finds every key."""

    messages = round_trips = nowait_leases_ended = nowait_refused = 0

    def lookup_prefix_leased(self, namespace: str, keys: list[bytes]) -> tuple[int, list[int]]:
        self.round_trips += 1
        return len(keys), []

    def close(self) -> None:
        pass


def test_a_ring_that_cannot_be_opened_means_misses_a_warning_and_a_counter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stats = ConnectorStats(str(tmp_path / "vllm-0"), role="worker1", min_interval_s=0)
    tried: list[str] = []

    def connect(address: str, **_: object) -> object:
        tried.append(address)
        raise OSError(f"cannot map {address}")

    index = BestEffortIndex("cxl:///nowhere/pool#5", stats=stats, retry_s=0.0, connect=connect)
    with caplog.at_level(logging.WARNING, logger="vllm.beluga"):
        assert index.lookup_prefix_leased("ns", [b"k" * 32]) == (0, [])  # a miss: vLLM recomputes
        assert index.get_many_tuples("ns", [b"k" * 32, b"j" * 32]) == [None, None]
        assert index.reserve_many("ns", [b"k" * 32], 4096) == [None]
    assert tried and set(tried) == {"cxl:///nowhere/pool#5"}  # only its ring, never a TCP address
    assert not index.healthy
    assert stats.get("ring_open_failed") == len(tried) and stats.get("server_unavailable") == len(tried)
    assert "not falling back to TCP" in caplog.text
    written = json.loads((tmp_path / "vllm-0.worker1.json").read_text())
    assert written["metadata_transport"] == "cxl" and written["metadata_address"] == "cxl:///nowhere/pool#5"
    assert "cannot map" in written["ring_error"] and written["healthy"] is False
    # once the ring opens, the error is history (its count stays)
    index._connect = lambda address, **_: _Client()
    assert index.lookup_prefix_leased("ns", [b"k" * 32]) == (1, []) and index.healthy
    assert stats.snapshot()["ring_error"] is None and stats.get("ring_open_failed") == len(tried)


def test_a_process_without_a_ring_asks_nobody(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stats = ConnectorStats(None, role="worker3")

    def connect(address: str, **_: object) -> object:
        raise AssertionError(f"dialled {address}")

    index = BestEffortIndex(None, stats=stats, retry_s=0.0, connect=connect)
    with caplog.at_level(logging.WARNING, logger="vllm.beluga"):
        assert index.lookup_prefix_leased("ns", [b"k" * 32]) == (0, [])
        assert index.finish_many([(1, 0)], []) == [False]
    assert stats.snapshot()["metadata_transport"] == "none"
    assert "no CXL-RPC ring was configured" in caplog.text and stats.get("server_unavailable") >= 1


def test_a_ring_that_opens_is_used_and_says_so(tmp_path: Path) -> None:
    stats = ConnectorStats(None, role="scheduler")
    got: list[str] = []
    index = BestEffortIndex("cxl:///p#0", stats=stats, connect=lambda a, **_: got.append(a) or _Client())
    assert index.lookup_prefix_leased("ns", [b"a", b"b"]) == (2, [])
    assert got == ["cxl:///p#0"] and index.round_trips == 1
    assert stats.snapshot()["metadata_transport"] == "cxl" and stats.get("ring_open_failed") == 0
