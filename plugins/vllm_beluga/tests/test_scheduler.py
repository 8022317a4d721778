"""The connector's scheduler side in real vLLM objects (config, Request, block hasher) against a real
metadata server: prefix hits, never the last token, local hits subtracted, switches, pins, outages."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.mds_process import Mds

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]
BS = 32


def test_scheduler_side_in_real_vllm(vllm_python: Path, server: Mds) -> None:
    driver = subprocess.run(  # noqa: S603
        [str(vllm_python), str(Path(__file__).with_name("scheduler_driver.py")),
         str(REPO / "examples" / "models" / "llama-cpu-demo"), server.tcp],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    lines = [x for x in driver.stdout.splitlines() if x.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, driver.stderr[-4000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))

    assert "PYTHONHASHSEED is unset" in out["unset_seed"]
    assert "pickled objects" in out["pickle_algo"]
    assert out["hashes"] == 8
    assert out["empty"] == [0, False]
    assert out["five_present"] == [5 * BS, False]
    assert out["five_present_two_local"] == [3 * BS, False]  # vLLM's own 2 blocks are not offered again
    assert out["all_present"] == [7 * BS, False]  # 8 full blocks, but the last token is always computed
    assert out["switched_off"] == [0, False]
    assert out["counters"]["hit_blocks"] == 5 + 3 + 7
    # A hit is one round trip of the scheduler's: one GET_MANY burst says how many blocks and where.
    assert out["hit_round_trips"] == 1
    # A lease per block found (r2: 5, r3: 5, r4: 8); once the step is built only the worker's remain:
    # r4's 7 blocks to load and its last block's (spare, released by the worker with its own).
    assert out["leases_after_lookups"] == out["leases_before_step"] == 5 + 5 + 8
    assert out["located"] == [7] and out["spare"] == [1]
    assert out["leases_after_step"] == 7 + 1
    assert out["lookup_leases_released"] == 5 + 5
    assert out["server_down"] == [0, False]
    assert out["server_down_healthy"] is False


def test_a_lookup_started_on_arrival_answers_at_scheduling(vllm_python: Path, server: Mds) -> None:
    """on_new_request sends the GET_MANY over the scheduler's CXL ring; get_num_new_matched_tokens
    takes it: the same answer as asking then, one round trip, and every lease accounted for
    (a stale answer asked again, an aborted request's answer released, several at once)."""
    driver = subprocess.run(  # noqa: S603
        [str(vllm_python), str(Path(__file__).with_name("lookup_on_arrival_driver.py")),
         str(REPO / "examples" / "models" / "llama-cpu-demo"), server.tcp, server.cxl(1)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    lines = [x for x in driver.stdout.splitlines() if x.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, driver.stderr[-4000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))

    assert out["lookup_on_arrival"] == [True, False]
    assert out["leases_after_post"] == 5  # granted on arrival, before vLLM asked
    assert out["early_answer"] == out["plain_answer"] == [5 * BS, False]
    assert out["early_trips"] == 1
    assert out["located"] == [5]
    assert out["stale_answer"] == [7 * BS, False]  # asked again: the blocks saved meanwhile are found
    assert out["switched_off"] == [0, False]
    assert out["many"] == [[7 * BS, False]] * 6
    assert out["leases_left"] == 5  # only r1's blocks, kept for its worker: nothing leaked
    assert out["counters"] == {"lookups_posted": 9, "lookups_posted_used": 7, "lookups_posted_dropped": 2}
    assert out["timed"] == {"lookup_post_us": True, "lookup_us": True, "lookup_dropped_us": True}
