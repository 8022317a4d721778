"""`belugactl bench overlap`: flags checked before anything starts; with the real CPU engine, the two
runs really differ in how they copy (asynchronous saves and layer-wise loads only in the overlap run),
and both load every block of the hit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from belugactl.cli.app import run


@pytest.mark.parametrize("args", [["--lengths", "x"], ["--lengths", "10"], ["--lengths", "9000"]])
def test_bad_lengths_are_a_usage_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "overlap", *args]) == 2
    assert "--lengths" in capsys.readouterr().err


def test_a_missing_vllm_python_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "overlap", "--vllm-python", "/nonexistent/python"]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_overlap_run_overlaps_and_the_sync_run_does_not(vllm_python) -> None:  # noqa: ANN001
    out = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "belugactl", "bench", "overlap", "--lengths", "512", "--rounds", "1",
         "--vllm-python", str(vllm_python), "--json"],
        capture_output=True, text=True, timeout=880, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    doc = json.loads(out.stdout)
    (row,) = doc["rows"]
    assert row["prompt_tokens"] == 512
    full = (512 - 1) // 32
    sync, over = doc["counters"]["sync"], doc["counters"]["overlap"]
    assert sync["async_saves"] == 0 and sync["layerwise_loads"] == 0
    assert over["async_saves"] >= 1 and over["layerwise_loads"] >= 1 and over["layer_waits"] >= 6
    for c in (sync, over):
        assert c["loaded_blocks"] == full and c["load_errors"] == 0
    assert row["miss_ratio"] == pytest.approx(row["overlap"]["miss_s"] / row["sync"]["miss_s"])
