"""`bench overlap`: what overlapping the connector's copies with the forward pass buys, side by side.

The real vLLM CPU engine with the Beluga connector runs twice on the same prompts, in two processes
(`vllm_beluga.bench_overlap` in the vLLM environment): once with synchronous copies (saves inside the
step that computed the blocks, loads before the forward pass) and once overlapped (saves on a
background thread, loads layer by layer). Each prompt is timed as a miss (computed and saved), a
pool hit and a recompute; the ratios say how much of the miss's and the hit's time the overlap took
off. Both runs use one real metadata server on a fresh file pool, over CXL-RPC rings in the pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from belugactl.errors import EnvironmentProblem
from belugactl.workflows.bench.server import running_server

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "examples" / "cpu-demo.yaml"
MODEL = REPO / "examples" / "models" / "llama-cpu-demo"


def run(
    vllm_python: str,
    *,
    lengths: Sequence[int] = (4000,),
    rounds: int = 3,
    timeout_s: float = 900.0,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    from belugactl.pool.file_pool import create_file_pool

    if not Path(vllm_python).exists():
        raise EnvironmentProblem(
            f"no vLLM environment at {vllm_python}", fix="run scripts/bootstrap-vllm, or pass --vllm-python"
        )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        pool = Path(tmp) / "pool"
        create_file_pool(pool, DEMO)
        with running_server(DEMO, pool):
            for setting in ("sync", "overlap"):
                say(f"bench overlap: {setting}: starting the engine (a minute on CPU), {rounds} round(s) per length")
                argv = [
                    vllm_python, "-m", "vllm_beluga.bench_overlap", "--model", str(MODEL),
                    # Scheduler and worker each on their own CXL-RPC ring (the connector's two clients).
                    "--address", f"cxl://{pool}#1", "--scheduler-address", f"cxl://{pool}#0",
                    "--pool", str(pool), "--setting", setting,
                    "--lengths", ",".join(map(str, lengths)), "--rounds", str(rounds),
                ]  # fmt: skip
                env = {**os.environ, "PYTHONHASHSEED": "0"}
                done = subprocess.run(  # noqa: S603 - argv list, our own module
                    argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
                )
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode != 0 or not lines:
                    raise EnvironmentProblem(
                        f"bench overlap: the {setting} run failed (exit {done.returncode})",
                        why=done.stderr.strip()[-3000:],
                    )
                results[setting] = json.loads(lines[-1].removeprefix("RESULT "))
    rows = []
    for sync_row, over_row in zip(results["sync"]["rows"], results["overlap"]["rows"], strict=True):
        rows.append(
            {
                "prompt_tokens": sync_row["prompt_tokens"],
                "sync": sync_row,
                "overlap": over_row,
                "miss_ratio": over_row["miss_s"] / sync_row["miss_s"],
                "hit_ratio": over_row["hit_s"] / sync_row["hit_s"],
            }
        )
    return {"rows": rows, "counters": {k: v["counters"] for k, v in results.items()}, "rounds": rounds}
