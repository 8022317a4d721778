"""The connector's scheduler side in real vLLM objects (config, Request, block hasher) against a real
metadata server: prefix hits, never the last token, local hits subtracted, switches, pins, outages."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from belugactl.pool.file_pool import create_file_pool

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]
BS = 32


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scheduler_side_in_real_vllm(vllm_python: Path, tmp_path: Path) -> None:
    manifest = REPO / "examples" / "cpu-demo.yaml"
    pool = tmp_path / "pool"
    create_file_pool(pool, manifest)
    admin, rpc = _port(), _port()
    server = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
         "--admin-port", str(admin), "--rpc-port", str(rpc), "--fence-grace", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1)  # noqa: S310
                break
            except OSError:
                time.sleep(0.1)
        probe = subprocess.run(  # noqa: S603
            [str(vllm_python), str(Path(__file__).with_name("scheduler_probe.py")),
             str(REPO / "examples" / "models" / "llama-cpu-demo"), f"tcp://127.0.0.1:{rpc}"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=20)
    lines = [x for x in probe.stdout.splitlines() if x.startswith("RESULT ")]
    assert probe.returncode == 0 and lines, probe.stderr[-4000:]
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
    assert out["server_down"] == [0, False]
    assert out["server_down_healthy"] is False
