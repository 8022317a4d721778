"""Real vLLM on CPU: the pool in vLLM's own KV events and /metrics.

`belugactl serve` runs the metadata server and one vLLM instance (examples/cpu-demo.yaml, one
instance) with vLLM's ZMQ KV-event publisher on; a subscriber (kv_events_listener.py, in the vLLM
venv) stands where a router's would. A computed prompt's saved blocks arrive as BlockStored with
the pool medium; a second, identical prompt is a pool hit and vLLM's /metrics counts it (hits,
loaded bytes = blocks x block bytes); the metadata server evicting those blocks arrives as
BlockRemoved of the same hashes.

Slow (an engine start): marked `vllm`. In CI (CI=true) a missing vLLM venv fails it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from belugactl.workflows.serve.traffic import complete, token_prompt
from tests.support.blocks import zeros_crc

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 600
BLOCK = 32
FULL_BLOCKS = (PROMPT_TOKENS - 1) // BLOCK  # the last prompt token is always computed
MEDIUM = "CXL"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _belugactl(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own CLI, argv list
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=timeout, check=False,
        env=env,
    )  # fmt: skip


def _until(pred: Callable[[], object], timeout_s: float, step: float = 0.3) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)


@dataclass
class Stack:
    run_dir: Path
    port: int
    rpc: int
    events_path: Path

    def events(self) -> list[dict]:
        if not self.events_path.exists():
            return []
        return [json.loads(x) for x in self.events_path.read_text().splitlines() if x.strip()]

    def metrics(self) -> dict[str, float]:
        """vLLM's /metrics, `vllm:beluga_*` samples summed over label sets."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:  # noqa: S310
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:beluga_"):
                name, _, value = line.rpartition(" ")
                base = name.split("{", 1)[0]
                out[base] = out.get(base, 0.0) + float(value)
        return out

    def worker_state(self) -> dict:
        path = next((self.run_dir / "stats").glob("vllm-0.worker*.json"))
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("events")
    admin, rpc, port, events = (_free_port() for _ in range(4))
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["hosts"][0]["instances"] = 1
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc)
    vllm = doc["serve"]["vllm"]
    vllm.update(port_base=port, model=str(REPO / "examples" / "models" / "llama-cpu-demo"))
    endpoint = f"tcp://127.0.0.1:{events}"  # a host, not *: vLLM's publisher connects to our subscriber
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
    vllm["extra_args"] = [*vllm["extra_args"], f"--kv-events-config={json.dumps(config)}"]
    manifest = tmp / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    # This checkout's code in every process (the venv may have another checkout installed).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins" / "vllm_beluga")])}
    events_path = tmp / "events.jsonl"
    listener = subprocess.Popen(  # noqa: S603
        [str(python), str(Path(__file__).with_name("kv_events_listener.py")), endpoint, str(events_path), "1500"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    run_dir = tmp / "run"
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "READY", listener.stderr
        started = _belugactl(
            "serve", "-f", str(manifest), "--pool", str(tmp / "pool"), "--create-pool", "--run-dir", str(run_dir),
            "--detach", "--vllm", str(venv / "bin" / "vllm-beluga"),
            timeout=900, env=env,
        )  # fmt: skip
        assert started.returncode == 0, f"serve failed:\n{started.stderr[-4000:]}"
        yield Stack(run_dir, port, rpc, events_path)
    finally:
        stopped = _belugactl("stop", "--run-dir", str(run_dir), timeout=120)
        listener.terminate()
        listener.wait(timeout=20)
        assert stopped.returncode == 0, stopped.stderr


def test_pool_events_and_metrics_through_vllm(stack: Stack) -> None:
    from belugactl.dataplane.client import connect

    prompt = token_prompt(PROMPT_TOKENS, seed=20261201)
    first = complete(stack.port, prompt, max_tokens=4)

    # 1. The saved blocks as BlockStored in the pool's medium: one chain, the prompt's tokens.
    def stored() -> list[dict]:
        return [e for e in stack.events() if e["type"] == "BlockStored" and e["medium"] == MEDIUM]

    events = _until(lambda: sum(len(e["hashes"]) for e in stored()) >= FULL_BLOCKS, 30) and stored()
    assert events, f"no pool BlockStored events: {stack.events()[:5]}"
    hashes = [h for e in events for h in e["hashes"]]
    assert len(hashes) == FULL_BLOCKS and len(set(hashes)) == FULL_BLOCKS
    assert events[0]["parent"] is None and all(e["block_size"] == BLOCK for e in events)
    for before, after in zip(events, events[1:], strict=False):
        assert after["parent"] == before["hashes"][-1]  # each event continues the chain
    assert [t for e in events for t in e["tokens"]] == prompt[: FULL_BLOCKS * BLOCK]

    # 2. The same prompt again (vLLM's own prefix cache is off): a pool hit, counted in vLLM's /metrics.
    m0 = _until(lambda: (m := stack.metrics()).get("vllm:beluga_saved_bytes_total") and m, 20)
    assert m0, stack.metrics()
    hit = complete(stack.port, prompt, max_tokens=4)
    assert hit.tokens == first.tokens
    block_nbytes = int(stack.worker_state()["block_nbytes"])

    def grew() -> dict[str, float] | None:
        m = stack.metrics()
        return m if m.get("vllm:beluga_loaded_blocks_total", 0) - m0.get("vllm:beluga_loaded_blocks_total", 0) else None

    m1 = _until(grew, 20)
    assert m1, stack.metrics()

    def delta(name: str) -> float:
        return m1[name] - m0.get(name, 0.0)

    assert delta("vllm:beluga_hit_requests_total") == 1
    assert delta("vllm:beluga_hit_blocks_total") == FULL_BLOCKS
    assert delta("vllm:beluga_loaded_blocks_total") == FULL_BLOCKS
    assert delta("vllm:beluga_loaded_bytes_total") == FULL_BLOCKS * block_nbytes
    assert delta("vllm:beluga_load_errors_total") == 0
    assert m1["vllm:beluga_saved_bytes_total"] == FULL_BLOCKS * block_nbytes  # the first request's save
    assert m1["vllm:beluga_lookup_seconds_count"] >= 2 and m1["vllm:beluga_lookup_round_trips_total"] >= 2

    # 3. The server evicts those blocks to make room for others: BlockRemoved of the same hashes.
    # The hit's prefix lookup holds a read lease on every block (10 s): leased blocks are never evicted.
    time.sleep(11)
    client = connect(f"tcp://127.0.0.1:{stack.rpc}", timeout_s=10)
    namespace = str(stack.worker_state()["namespace"])
    cursor = client.removals_since(0, max_items=0).head
    capacity = client.stats()["bytes_capacity"]
    chunk = 16 << 20
    for i in range(capacity // chunk + 8):  # bounded: past the high watermark, so the coldest go
        r = client.reserve("filler", b"filler-%06d" % i, chunk)
        client.commit(r.token, zeros_crc(r.nbytes))
        if len(client.removals_since(cursor, namespace).items) >= FULL_BLOCKS:
            break
    removed_keys = client.removals_since(cursor, namespace).items
    client.close()
    assert {r.why for r in removed_keys} == {"evicted"} and len(removed_keys) >= FULL_BLOCKS

    time.sleep(1.2)  # the connector polls the server's removals at most every second, when vLLM steps
    complete(stack.port, token_prompt(64, seed=5), max_tokens=2)

    def removed() -> set:
        return {h for e in stack.events() if e["type"] == "BlockRemoved" and e["medium"] == MEDIUM for h in e["hashes"]}

    gone_hashes = _until(lambda: set(hashes) <= removed(), 30) and removed()
    assert gone_hashes and set(hashes) <= gone_hashes, (hashes[:3], sorted(removed())[:3])
    # The hashes are vLLM's (ints under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): the server's keys, converted.
    as_vllm = {int.from_bytes(r.key, "big") & ((1 << 64) - 1) if isinstance(hashes[0], int) else r.key.hex()
               for r in removed_keys}  # fmt: skip
    assert set(hashes) <= as_vllm
