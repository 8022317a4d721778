"""Prefill/decode disaggregation with real vLLM on CPU: `belugactl serve` runs a producer (vllm-0), a
consumer (vllm-1) and the P/D front door from one manifest (examples/cpu-demo.yaml with
`serve.vllm.kv_roles`); a request through the front door is prefilled on the producer, whose blocks the
consumer loads instead of computing, and the greedy tokens are those of a plain recompute.

Slow (two engine starts): marked `vllm`. In CI (CI=true) a missing vLLM venv fails it, never skips.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.supervisor import pid_alive
from belugactl.workflows.serve.traffic import complete, prompt_token_sources, token_prompt
from tests.serve.test_e2e_vllm import BLOCK, FULL_BLOCKS, PROMPT_TOKENS, Stack, _belugactl, _free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, int]]:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    if not (venv / "bin" / "python").exists():
        message = f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("pd")
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    admin, rpc, router, stats, port_a, port_b = _free_ports(6)
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc)
    doc["serve"]["vllm"]["port_base"] = port_a
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
    doc["serve"]["vllm"]["kv_roles"] = ["kv_producer", "kv_consumer"]
    doc["serve"]["router"] = {"port": router, "stats_port": stats}
    manifest = tmp / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run_dir = tmp / "run"
    started = _belugactl(
        "serve", "-f", str(manifest), "--pool", str(tmp / "pool"), "--create-pool", "--run-dir", str(run_dir),
        "--detach", "--vllm", str(venv / "bin" / "vllm-beluga"),
        timeout=800,
    )  # fmt: skip
    try:
        assert started.returncode == 0, f"serve failed:\n{started.stderr[-4000:]}"
        yield Stack(run_dir, port_a, port_b), router
    finally:
        stopped = _belugactl("stop", "--run-dir", str(run_dir), timeout=120)
        state = read_state(run_dir) or {}
        left = [p["name"] for p in state.get("processes", []) if pid_alive(p.get("pid"))]
        assert stopped.returncode == 0, stopped.stderr
        assert not left, f"still running after stop: {left}"


def test_a_request_through_the_pd_front_door_decodes_from_the_producers_kv(pd: tuple[Stack, int]) -> None:
    stack, router = pd
    prompt = token_prompt(PROMPT_TOKENS, seed=4242)
    # The consumer alone, connector off for this request: its own prefill, the reference answer.
    reference = complete(stack.port_b, prompt, max_tokens=8, use_pool=False)
    before = prompt_token_sources(stack.port_b)

    answer = complete(router, prompt, max_tokens=8)

    after = prompt_token_sources(stack.port_b)
    producer = stack.counters("vllm-0")
    consumer = stack.counters("vllm-1")
    # The producer computed the prompt and saved every full block before it answered the front door.
    assert producer.get("saved_blocks") == PROMPT_TOKENS // BLOCK, producer
    assert producer.get("async_saves", 0) == 0  # a producer saves synchronously
    # The consumer loaded them, computed only the tail, and saved nothing.
    assert consumer.get("loaded_blocks") == FULL_BLOCKS, consumer
    assert consumer.get("load_errors", 0) == 0
    assert consumer.get("saved_blocks", 0) == 0
    loaded = after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)
    computed = after.get("local_compute", 0) - before.get("local_compute", 0)
    assert loaded == FULL_BLOCKS * BLOCK, (before, after)
    assert computed == PROMPT_TOKENS - FULL_BLOCKS * BLOCK, (before, after)
    # Greedy: the same tokens as the consumer's own prefill.
    assert len(answer.tokens) == 8
    assert answer.tokens == reference.tokens


def test_the_front_door_is_the_pd_proxy_and_counts_its_phases(pd: tuple[Stack, int]) -> None:
    import urllib.request

    stack, router = pd
    state = read_state(stack.run_dir)
    front = next(p for p in state["processes"] if p["name"] == "router")
    assert front["health_url"] == f"http://127.0.0.1:{router}/healthz"  # HAProxy's would be on the stats port
    complete(router, token_prompt(100, seed=1), max_tokens=2)
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline and 'phase="decode"' not in text:
        with urllib.request.urlopen(f"http://127.0.0.1:{router}/metrics", timeout=10) as r:  # noqa: S310
            text = r.read().decode()
        time.sleep(0.2)
    assert 'beluga_pd_phase_seconds_count{phase="prefill"}' in text
    assert 'beluga_pd_requests_total{outcome="ok"}' in text
