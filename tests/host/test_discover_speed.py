"""Discovery's speed-ups keep every fact: concurrent tool runs, per-process tool versions, topics."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from belugactl.host import read_tools
from belugactl.host.command_runner import CommandResult, RecordedRunner, RecordingRunner
from belugactl.host.host import Host
from belugactl.workflows.discover import TOPICS, discover
from tests.support.fixture_trees import snapshot, tree, without_root


class SlowRunner:
    """Replays a fixture's tool output, each run taking `delay` seconds; counts runs and overlap."""

    def __init__(self, inner: RecordedRunner, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.calls: list[tuple[str, ...]] = []
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        with self._lock:
            self.calls.append(tuple(argv))
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.delay)
        with self._lock:
            self.running -= 1
        return self.inner.run(argv, timeout=timeout, input=input)


def _slow_host(name: str, delay: float = 0.05) -> tuple[Host, SlowRunner]:
    fixture = Host.from_tree(tree(name))
    assert isinstance(fixture.runner, RecordedRunner)
    runner = SlowRunner(fixture.runner, delay)
    return Host(tree(name), runner), runner


@pytest.mark.parametrize("name", ["lab-guest", "beluga-intel"])
def test_concurrent_discovery_gives_the_same_snapshot_running_each_tool_once(name: str) -> None:
    host, runner = _slow_host(name)
    t0 = time.perf_counter()
    snap = discover(host, concurrent=True)
    concurrent_s = time.perf_counter() - t0
    assert without_root(snap.to_dict()) == without_root(snapshot(name).to_dict())
    # 4 versions, 6 cxl (4 listings, health, poison), ndctl, daxctl
    assert len(runner.calls) == len(set(runner.calls)) == 12
    assert runner.peak >= 4  # they did run side by side
    assert isinstance(host.runner, SlowRunner)  # the host's own runner is back in place
    sequential, seq_runner = _slow_host(name)
    t0 = time.perf_counter()
    discover(sequential, concurrent=False)
    assert seq_runner.peak == 1 and time.perf_counter() - t0 > concurrent_s


def test_topics_skip_what_the_caller_does_not_need() -> None:
    host, runner = _slow_host("lab-guest", delay=0)
    snap = discover(host, topics={"cxl", "nd", "dax", "hugepages"})
    assert snap.tools == {} and snap.pci == [] and snap.root_ports == [] and snap.numa == []
    assert snap.topics_skipped == sorted(TOPICS - {"cxl", "nd", "dax", "hugepages"})
    assert not any(argv[-1] in ("version", "--version") for argv in runner.calls)
    full = snapshot("lab-guest")
    assert (snap.cxl, snap.nd, snap.dax, snap.hugepages) == (full.cxl, full.nd, full.dax, full.hugepages)
    assert snap.problems == []
    with pytest.raises(ValueError, match="unknown discovery topic"):
        discover(host, topics={"cxl", "gpus"})


class VersionRunner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), 0, "setpci version 3.9.0\n" if argv[0] == "setpci" else "76.1\n", "")


def test_tool_versions_are_read_once_per_process_until_the_binary_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "ndctl"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setattr(read_tools.shutil, "which", lambda name: str(binary) if name == "ndctl" else None)
    monkeypatch.setattr(read_tools, "_VERSION_CACHE", {})
    runner = VersionRunner()
    live = Host("/", runner)
    argv = read_tools.VERSION_ARGV["ndctl"]
    first = read_tools.read_tool(live, "ndctl", argv, [])
    again = read_tools.read_tool(live, "ndctl", argv, [])
    assert first == again and (first.major, first.path) == (76, str(binary))
    assert runner.calls == [argv]
    assert read_tools.cached_tool(live, "ndctl") == first
    # An upgrade (new mtime) is read again.
    stat = binary.stat()
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    read_tools.read_tool(live, "ndctl", argv, [])
    assert runner.calls == [argv, argv]
    # A capture records every run: tracing hosts never use the cache.
    recording = RecordingRunner(runner)
    tracing = Host("/", recording, trace=True)
    read_tools.read_tool(tracing, "ndctl", argv, [])
    assert [r.argv for r in recording.results] == [argv]
    # Fixture trees are never cached either (each tree is another machine).
    assert read_tools.cached_tool(Host.from_tree(tree("lab-guest")), "ndctl") is None
