"""Real vLLM on CPU, end to end: `belugactl serve` runs the metadata server and two vLLM instances on
a file-backed pool (examples/cpu-demo.yaml); a prompt computed on A is loaded, not computed, on B.

Slow (two engine starts): marked `vllm`. In CI (CI=true) a missing vLLM venv fails these tests.
vLLM's compile cache (~/.cache/vllm) makes later starts faster; CI should cache it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.supervisor import pid_alive
from belugactl.workflows.serve.traffic import complete, prompt_token_sources, token_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 2000
BLOCK = 32
FULL_BLOCKS = (PROMPT_TOKENS - 1) // BLOCK  # the last prompt token is always computed


def _free_ports(n: int) -> list[int]:
    """n free ports, the last two consecutive (vLLM instances take port_base and port_base + 1)."""
    socks = []
    ports: list[int] = []
    try:
        while len(ports) < n - 2:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
        for base in range(20100, 40000, 7):
            if base in ports or base + 1 in ports:
                continue
            pair = []
            for p in (base, base + 1):
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    s.close()
                    break
                pair.append(s)
            if len(pair) == 2:
                socks.extend(pair)
                return [*ports, base, base + 1]
            for s in pair:
                s.close()
    finally:
        for s in socks:
            s.close()
    raise RuntimeError("no free port pair")


@dataclass
class Stack:
    run_dir: Path
    port_a: int
    port_b: int

    def counters(self, instance: str, *, quiet_s: float = 1.0, settle_s: float = 6.0) -> dict[str, int]:
        """The instance's connector counters (scheduler + workers). Each process's writer thread
        rewrites its file at most every 0.2 s, and inside a busy vLLM worker the write has been seen
        to trail the count by up to about half a second: wait until the counters stayed the same
        for `quiet_s` (at most `settle_s`)."""
        import time

        current = self._read(instance)
        since = time.monotonic()
        deadline = since + settle_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self._read(instance)
            if now != current:
                current, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return current

    def _read(self, instance: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for path in (self.run_dir / "stats").glob(f"{instance}.*.json"):
            for k, v in json.loads(path.read_text())["counters"].items():
                out[k] = out.get(k, 0) + v
        return out


def _belugactl(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own CLI, argv list
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    if not (venv / "bin" / "python").exists():
        message = f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("cpu-demo")
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    admin, rpc, port_a, port_b = _free_ports(4)
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc)
    doc["serve"]["vllm"]["port_base"] = port_a
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
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
        yield Stack(run_dir, port_a, port_b)
    finally:
        stopped = _belugactl("stop", "--run-dir", str(run_dir), timeout=120)
        state = read_state(run_dir) or {}
        left = [p["name"] for p in state.get("processes", []) if pid_alive(p.get("pid"))]
        assert stopped.returncode == 0, stopped.stderr
        assert not left, f"still running after stop: {left}"


def test_b_loads_what_a_computed_and_answers_the_same(stack: Stack) -> None:
    prompt = token_prompt(PROMPT_TOKENS, seed=20261129)
    a = complete(stack.port_a, prompt, max_tokens=8)
    # Saves finish off the request's critical path (a background thread): the answer may come back
    # a few milliseconds before its blocks are committed. Wait for them, boundedly.
    deadline = time.monotonic() + 30
    saved = stack.counters("vllm-0").get("saved_blocks", 0)
    while saved < FULL_BLOCKS and time.monotonic() < deadline:
        time.sleep(0.3)
        saved = stack.counters("vllm-0").get("saved_blocks", 0)
    assert saved >= FULL_BLOCKS, f"A saved {saved} blocks, expected {FULL_BLOCKS}"

    # B with the connector off for this request: its own full prefill, the reference answer.
    before = prompt_token_sources(stack.port_b)
    reference = complete(stack.port_b, prompt, max_tokens=8, use_pool=False)
    middle = prompt_token_sources(stack.port_b)
    assert middle.get("external_kv_transfer", 0) == before.get("external_kv_transfer", 0)
    assert stack.counters("vllm-1").get("hit_blocks", 0) == 0

    # B with the pool: the blocks A saved are found and loaded instead of computed.
    hit = complete(stack.port_b, prompt, max_tokens=8)
    after = prompt_token_sources(stack.port_b)
    counters = stack.counters("vllm-1")
    assert counters.get("hit_blocks") == FULL_BLOCKS
    assert counters.get("loaded_blocks") == FULL_BLOCKS
    assert counters.get("load_errors", 0) == 0
    # layerwise_loads "auto" on a CPU engine: the hit is copied whole before the forward pass.
    assert counters.get("layerwise_loads", 0) == 0
    worker = json.loads(next((stack.run_dir / "stats").glob("vllm-1.worker*.json")).read_text())
    assert worker["load_mode"] == "before the forward pass"
    assert worker["pool_prefault"].startswith("done: 1024 MiB"), worker["pool_prefault"]  # a file pool
    loaded_tokens = after.get("external_kv_transfer", 0) - middle.get("external_kv_transfer", 0)
    computed_tokens = after.get("local_compute", 0) - middle.get("local_compute", 0)
    assert loaded_tokens == FULL_BLOCKS * BLOCK, (before, middle, after)
    assert computed_tokens == PROMPT_TOKENS - FULL_BLOCKS * BLOCK, (before, middle, after)

    # Greedy: identical tokens from the loaded KV and from B's own prefill (and A's).
    assert len(hit.tokens) == 8
    assert hit.tokens == reference.tokens == a.tokens


def test_status_reports_processes_and_pool_usage(stack: Stack) -> None:
    out = _belugactl("status", "--run-dir", str(stack.run_dir), "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["running"] is True
    names = {p["name"]: p for p in doc["processes"]}
    assert set(names) == {"metadata-server", "vllm-0", "vllm-1"}
    assert all(p["healthy"] for p in names.values())
    assert doc["pool"]["entries"] >= FULL_BLOCKS
    assert doc["pool"]["bytes_used"] > 0


def test_metadata_server_crash_costs_hits_never_answers(stack: Stack) -> None:
    """SIGKILL the metadata server: requests still get the right tokens (misses, recompute); the
    supervisor restarts it (new epoch, empty index), the connectors reconnect, and hits come back."""
    import signal
    import time

    from belugactl.workflows.serve.supervisor import http_ok

    state = read_state(stack.run_dir)
    server = next(p for p in state["processes"] if p["name"] == "metadata-server")
    os.kill(server["pid"], signal.SIGKILL)
    time.sleep(0.5)
    prompt = token_prompt(PROMPT_TOKENS, seed=7)
    reference = complete(stack.port_b, prompt, max_tokens=4, use_pool=False)
    during = complete(stack.port_b, prompt, max_tokens=4)
    assert during.tokens == reference.tokens

    deadline = time.monotonic() + 120
    url = server["health_url"]
    while time.monotonic() < deadline:
        state = read_state(stack.run_dir)
        current = next(p for p in state["processes"] if p["name"] == "metadata-server")
        if current["pid"] != server["pid"] and current["restarts"] >= 1 and http_ok(url):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the supervisor did not restart the metadata server")

    # Connectors retry after their back-off; keep asking with fresh prompts until B hits again.
    hits_before = stack.counters("vllm-1").get("hit_blocks", 0)
    for attempt in range(20):
        fresh = token_prompt(PROMPT_TOKENS, seed=100 + attempt)
        first = complete(stack.port_a, fresh, max_tokens=4)
        second = complete(stack.port_b, fresh, max_tokens=4)
        assert first.tokens == second.tokens
        if stack.counters("vllm-1").get("hit_blocks", 0) > hits_before:
            break
        time.sleep(1)
    else:
        pytest.fail("no pool hits after the metadata server came back")
    assert stack.counters("vllm-1").get("server_unavailable", 0) + stack.counters("vllm-1").get("stale_epoch", 0) >= 1
