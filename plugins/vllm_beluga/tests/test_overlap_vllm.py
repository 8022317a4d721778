"""Asynchronous saves and layer-wise loads in the real vLLM CPU engine (overlap_driver.py): a request's
blocks are never put back on vLLM's free list while a save of them is pending (and the driver does see
it happen when the hold is switched off), and a prompt loaded layer by layer answers as a recompute."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.mds_process import Mds

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]


def test_saves_overlap_yet_never_read_freed_blocks_and_loads_go_layer_by_layer(
    vllm_python: Path, server: Mds
) -> None:
    driver = subprocess.run(  # noqa: S603
        [str(vllm_python), str(Path(__file__).with_name("overlap_driver.py")),
         str(REPO / "examples" / "models" / "llama-cpu-demo"), server.tcp, str(server.pool_path)],
        capture_output=True, text=True, timeout=800, check=False,
    )  # fmt: skip
    lines = [x for x in driver.stdout.splitlines() if x.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, driver.stderr[-4000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    print(json.dumps(out))  # the figures, for `pytest -s`

    assert out["held"]["saves"] >= 1
    assert out["held"]["violations"] == 0, out
    assert out["control"]["saves"] >= 1
    assert out["control"]["violations"] > 0, out  # the driver catches an early free when there is one
    counters = out["counters"]
    assert out["tokens_equal"], out
    assert counters["layerwise_loads"] >= 1
    assert counters["loaded_blocks"] == 9  # (320 - 1) // 32 full blocks offered, all loaded
    assert counters["load_errors"] == 0
    assert counters["layer_waits"] >= out["num_layers"] == 6  # every attention layer waited for its own copy
