"""The test tiers, kept honest: a pytest plugin that tests/conftest.py registers for the whole run
(tests/ and plugins/ alike).

- `native`: without the native helper such a test is skipped with the reason, and fails under
  `CI=true`, wherever the test lives.
- `process`: added to every test that uses a fixture known to start a process (a metadata-server
  process, a vLLM venv, a lab); a test without `process`, `lab` or `vllm` that starts a process anyway
  (subprocess, fork, multiprocessing, posix_spawn, os.system) fails, saying to mark it. So
  `-m "not lab and not vllm and not process"` is the fast tier and stays fast.
- At the end of the run: the seconds each tier took (setup, call and teardown of its tests).
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

NATIVE_MISSING = "the native helper is not built (.venv/bin/pip install -e . --no-build-isolation)"

# Fixtures that start a process, by name: a test using one is in the `process` tier.
PROCESS_FIXTURES = frozenset({
    "server",        # plugins/vllm_beluga/tests/conftest.py: a metadata-server process on the CPU demo's pool
    "mds",           # tests/hostile/conftest.py: a metadata-server process with small limits
    "vllm_python",   # the vLLM venv: its tests run vLLM's Python
})  # fmt: skip

# Tests that start a process in files whose owners keep them unmarked for now (module: test names);
# a `pytestmark`/`@pytest.mark.process` in the file itself can replace an entry here.
PROCESS_TESTS: dict[str, tuple[str, ...]] = {
    "plugins/vllm_beluga/tests/test_transfer.py": ("test_leases_that_expired_during_a_slow_load_are_still_caught",),
    "tests/dataplane/test_batched_puts.py": (
        "test_a_long_prefix_lookup_is_one_burst_and_stops_at_the_first_gap",
        "test_a_ring_smaller_than_the_burst_is_used_as_a_sliding_window",
        "test_a_save_costs_the_same_round_trips_for_8_and_62_blocks",
        "test_batched_commits_are_journaled_and_survive_a_sigkill",
    ),
    "tests/dataplane/test_bench_smoke.py": (
        "test_bench_mds_json",
        "test_bench_rpc_json",
    ),
    "tests/dataplane/test_bench_soak.py": (
        "test_soak_catches_a_writer_that_writes_wrong_bytes",
        "test_soak_stops_at_its_op_bound",
        "test_soak_with_restart_and_kills_serves_no_wrong_byte",
        "test_stalled_writers_overwrites_are_caught_never_served",
    ),
    "tests/dataplane/test_checksums.py": ("test_table_kernel_is_used_without_sse42_and_agrees",),
    "tests/dataplane/test_native.py": ("test_sse2_kernel_is_exact_too",),
    "tests/dataplane/test_ring_per_process.py": ("test_every_process_of_the_layout_on_its_own_ring_at_once",),
    "tests/dataplane/test_server_process.py": (
        "test_admin_http_on_loopback",
        "test_several_client_processes_over_cxl_and_tcp",
        "test_sigkill_mid_put_leaves_nothing_visible_and_fences_old_clients",
        "test_sigkill_mid_put_with_journal_restores_committed_blocks_only",
        "test_tcp_garbage_is_answered_or_dropped_and_the_server_keeps_serving",
        "test_two_phase_put_is_invisible_to_other_clients_until_commit",
        "test_works_without_the_native_helper",
    ),
    "tests/hostile/test_admin_http.py": ("test_idle_and_vanishing_admin_clients",),
    "tests/hostile/test_listener_attacks.py": ("test_emfile_backs_off_instead_of_spinning",),
    "tests/hostile/test_removals_attacks.py": ("test_a_cursor_from_before_a_restart_is_fenced_then_refused",),
    "tests/hostile/test_stale_epoch_writer.py": (
        "test_stale_writer_after_sigkill_restart_never_overwrites_a_new_block",
    ),
    "tests/hostile/test_stalled_writer_checksum.py": (
        "test_stalled_writer_overwriting_a_recommitted_block_is_caught_by_the_reader",
    ),
}

# A test's tier: the first of these markers it carries, else "fast" (order: the most expensive first).
TIERS = ("lab_ram", "lab", "vllm", "hostile", "native", "process")
ALLOWED_TO_START_PROCESSES = ("process", "lab", "vllm")


STARTED = pytest.StashKey[list[str]]()
REFUSING = pytest.StashKey[pytest.MonkeyPatch]()
MARK_IT = "mark it `process` (pytest.mark.process), or use a fixture that is (tests/support/tiers.py)"


class ProcessStartedInFastTier(BaseException):  # noqa: N818 - not an Exception: `except Exception` must not hide it
    """A test outside the process, lab and vllm tiers started a process."""


def tier_of(item: pytest.Item) -> str:
    return next((t for t in TIERS if item.get_closest_marker(t) is not None), "fast")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


class TierPlugin:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            module, _, name = item.nodeid.partition("::")
            if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())) or (
                name.split("[")[0] in PROCESS_TESTS.get(module, ())
            ):
                item.add_marker(pytest.mark.process)
            # On the item's reports too (user_properties travel with them), for the summary below.
            item.user_properties.append(("tier", tier_of(item)))

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.get_closest_marker("native") is None:
            return
        from belugactl.dataplane import native

        if native._native is not None:
            return
        if _in_ci():
            pytest.fail(f"{NATIVE_MISSING}; CI must build it and run these tests", pytrace=False)
        pytest.skip(NATIVE_MISSING)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        # Around setup, call and teardown: a module-scoped fixture that starts a server counts too.
        if any(item.get_closest_marker(m) for m in ALLOWED_TO_START_PROCESSES):
            return (yield)
        started: list[str] = []
        item.stash[STARTED] = started

        def refuse(what: str) -> Callable[..., Any]:
            def refused(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
                started.append(what)
                raise ProcessStartedInFastTier(f"{item.nodeid} started a process ({what}): {MARK_IT}")

            return refused

        mp = item.stash[REFUSING] = pytest.MonkeyPatch()
        mp.setattr(subprocess.Popen, "_execute_child", refuse("subprocess"))
        mp.setattr(multiprocessing.util, "spawnv_passfds", refuse("multiprocessing"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                mp.setattr(os, name, refuse(f"os.{name}"))
        try:
            return (yield)
        finally:
            mp.undo()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        # The session's last test also tears down the session's fixtures (a lab guest's `lab down`,
        # a shared server): those belong to the tests that used them, not to this one.
        mp = item.stash.get(REFUSING, None)
        if nextitem is None and mp is not None:
            mp.undo()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
        report = yield
        started = item.stash.get(STARTED, None)
        if started is None:
            return report
        if report.failed:
            started.clear()  # already failed, with the refusal in its traceback
        elif started and report.when == "teardown":
            # The test (or a thread of it) swallowed the refusal: it fails all the same.
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} started a process ({', '.join(started)}): {MARK_IT}"
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = dict(report.user_properties).get("tier", "fast")
        self.seconds[tier] += report.duration
        self.tests[tier].add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:  # noqa: ANN401
        if not self.seconds:
            return
        terminalreporter.section("seconds per tier")
        for tier in ("fast", "process", *reversed(TIERS[:-1])):
            if tier in self.tests:
                terminalreporter.write_line(f"{tier:>8}: {self.seconds[tier]:8.1f} s  {len(self.tests[tier]):5d} tests")
