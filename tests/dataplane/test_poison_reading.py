"""The metadata server's own read of its pool device's poison lists (pool/poison_reading.py) places
them as doctor does, and its periodic check (mds/poison.py:PoisonChecker) queues them off the loop."""

from __future__ import annotations

import threading
from pathlib import Path

from belugactl.dataplane.mds.poison import PoisonChecker
from belugactl.host.command_runner import CommandResult
from belugactl.host.host import Host
from belugactl.host.read_cxl_health import MEDIA_ERRORS_LIST
from belugactl.pool.poison_reading import device_poison_reader, read_pool_poison
from belugactl.units import MiB

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "tests" / "fixtures" / "lab-guest"  # its dax0.0 starts 2 MiB into region0
RECORDED = REPO / "tests" / "fixtures" / "cxl-health"


def _host(media: str | None, rc: int = 0, stderr: str = "") -> Host:
    host = Host.from_tree(TREE)
    if media is not None:
        out = (RECORDED / media).read_text()
        host.runner.add(CommandResult(MEDIA_ERRORS_LIST, rc, out, stderr))  # type: ignore[attr-defined]
    return host


def test_the_pool_devices_poison_is_placed_as_doctor_places_it() -> None:
    ranges, problem = read_pool_poison(_host("media-errors-in-region.json"), "dax0.0")
    # doctor's tests/doctor/test_health.py names the same two; the info block's line is not the pool's
    assert (ranges, problem) == ([(254 * MiB, 64), (254 * MiB + 0x1000, 128)], None)


def test_unread_lists_are_not_clean() -> None:
    ranges, problem = read_pool_poison(_host("media-errors-in-region.json", stderr="tracefs: permission denied"),
                                       "dax0.0")  # fmt: skip
    assert ranges is None and problem is not None and "not read" in problem
    ranges, problem = read_pool_poison(_host("media-errors-in-region.json"), "dax9.9")
    assert ranges is None and "dax9.9" in (problem or "")


def test_a_file_pool_has_no_reader(tmp_path: Path) -> None:
    assert device_poison_reader(tmp_path / "pool") is None
    assert device_poison_reader("/dev/dax0.0", Host.from_tree(TREE)) is not None


class _Watch:
    def __init__(self) -> None:
        self.got: list = []
        self.done = threading.Event()

    def record_check(self, ranges, problem) -> None:  # noqa: ANN001
        self.got.append((ranges, problem))
        if len(self.got) >= 2:
            self.done.set()


def test_the_periodic_check_runs_in_its_thread_and_survives_a_failing_reader() -> None:
    calls = iter([RuntimeError("cxl went away"), ([(0, 64)], None)])

    def reader():  # noqa: ANN202
        item = next(calls, ([], None))
        if isinstance(item, Exception):
            raise item
        return item

    watch = _Watch()
    checker = PoisonChecker(watch, reader, interval_s=0)  # type: ignore[arg-type]
    checker.interval_s = 0.001  # the floor is for operators; the test moves on at once
    checker.start()
    assert watch.done.wait(10)
    checker.stop()
    checker.thread.join(5)
    assert watch.got[0] == (None, "RuntimeError: cxl went away") and watch.got[1] == ([(0, 64)], None)
    assert not checker.thread.is_alive()


class _SlowOnce:
    """A runner whose first poison listing times out (as among discovery's parallel listings)."""

    def __init__(self, out: str) -> None:
        self.out, self.calls = out, []

    def run(self, argv, *, timeout: float = 30.0, input=None) -> CommandResult:  # noqa: A002, ANN001
        self.calls.append(timeout)
        if len(self.calls) == 1:
            return CommandResult(tuple(argv), -1, timed_out=True)
        return CommandResult(tuple(argv), 0, self.out)


def test_a_poison_listing_that_timed_out_is_read_once_more_with_longer() -> None:
    from belugactl.host.read_cxl_health import LIST_TIMEOUT_S, MEDIA_ERRORS_TIMEOUT_S, read_media_errors

    runner = _SlowOnce((RECORDED / "media-errors-in-region.json").read_text())
    problems: list[str] = []
    got = read_media_errors(Host(TREE, runner), problems)  # type: ignore[arg-type]
    assert runner.calls == [LIST_TIMEOUT_S, MEDIA_ERRORS_TIMEOUT_S] and problems == []
    assert got is not None and len(got["region0"]) == 3
