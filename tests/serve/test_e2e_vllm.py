"""Real vLLM on CPU, end to end, on one serve stack: `belugactl serve` runs the metadata server, two
vLLM instances on a file-backed pool (examples/cpu-demo.yaml) and HAProxy in front of them
(serve.router). In order, on the same stack (two engine starts for all of it):
- a prompt computed on A is loaded, not computed, on B, and `status` reports the four processes;
- requests through the front door reach both instances; the real Prometheus scrapes every target of
  `belugactl export prometheus`; `bench serve --via-router` times TTFT through it;
- then the destructive ones, last: the metadata server is killed (answers stay right, hits come
  back), one instance is killed and traffic through the front door continues; `stop` drains the
  router and leaves nothing.

Slow: marked `vllm`. In CI (CI=true) a missing vLLM venv, haproxy or prometheus fails these tests.
vLLM's compile cache (~/.cache/vllm) makes later starts faster; CI should cache it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.supervisor import pid_alive
from belugactl.workflows.serve.traffic import complete, prompt_token_sources, token_prompt
from tests.support.needs import need

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

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


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback test URLs
        return resp.read().decode()


@dataclass
class Stack:
    run_dir: Path
    port_a: int
    port_b: int
    manifest: Path | None = None
    tmp: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)

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

    def sessions(self) -> dict[str, int]:
        """HAProxy's total sessions per backend server (its stats CSV, column stot)."""
        rows = [line.split(",") for line in _get(f"http://127.0.0.1:{self.ports['stats']}/stats;csv").splitlines()]
        return {r[1]: int(r[7] or 0) for r in rows if r and r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}

    def server_status(self) -> dict[str, str]:
        rows = [line.split(",") for line in _get(f"http://127.0.0.1:{self.ports['stats']}/stats;csv").splitlines()]
        return {r[1]: r[17] for r in rows if r and r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}

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
    need(
        (venv / "bin" / "python").exists(), f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
    )
    need(shutil.which("haproxy") is not None, "haproxy is not installed (scripts/bootstrap installs it)")
    need(shutil.which("prometheus") is not None, "prometheus is not installed (scripts/bootstrap installs it)")
    tmp = tmp_path_factory.mktemp("cpu-demo")
    admin, rpc, router, stats, port_a, port_b = _free_ports(6)
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc)
    doc["serve"]["vllm"]["port_base"] = port_a
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
    doc["serve"]["router"] = {"port": router, "stats_port": stats, "check_interval_ms": 500, "drain_timeout_s": 20}
    manifest = tmp / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run_dir = tmp / "run"
    started = _belugactl(
        "serve", "-f", str(manifest), "--pool", str(tmp / "pool"), "--create-pool", "--run-dir", str(run_dir),
        "--detach", "--vllm", str(venv / "bin" / "vllm-beluga"),
        timeout=800,
    )  # fmt: skip
    ports = {"router": router, "stats": stats, "a": port_a, "b": port_b, "admin": admin}
    try:
        assert started.returncode == 0, f"serve failed:\n{started.stderr[-4000:]}"
        yield Stack(run_dir, port_a, port_b, manifest, tmp, ports)
    finally:
        stopped = _belugactl("stop", "--run-dir", str(run_dir), timeout=180)
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
    # The worker releases the leases B's scheduler was granted: a hand-over within one engine's group,
    # never refused as a stranger's release (issue 30).
    requests = json.loads(_get(f"http://127.0.0.1:{stack.ports['admin']}/stats"))["requests"]
    assert requests["foreign_refused"] == 0, requests


def test_status_reports_processes_and_pool_usage(stack: Stack) -> None:
    out = _belugactl("status", "--run-dir", str(stack.run_dir), "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["running"] is True
    names = {p["name"]: p for p in doc["processes"]}
    assert set(names) == {"metadata-server", "vllm-0", "vllm-1", "router"}
    assert all(p["healthy"] for p in names.values())
    assert doc["pool"]["entries"] >= FULL_BLOCKS
    assert doc["pool"]["bytes_used"] > 0


def test_status_shows_the_router_healthy(stack: Stack) -> None:
    out = _belugactl("status", "--run-dir", str(stack.run_dir), "--json", timeout=60)
    doc = json.loads(out.stdout)
    names = {p["name"]: p for p in doc["processes"]}
    assert set(names) == {"metadata-server", "vllm-0", "vllm-1", "router"}
    assert names["router"]["healthy"] and names["router"]["port"] == stack.ports["router"]
    assert (stack.run_dir / "haproxy.cfg").read_text().count("    server cpu-demo-vllm-") == 2


def test_requests_through_the_front_door_reach_both_instances(stack: Stack) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(stack.server_status().values()) != {"UP"}:
        time.sleep(0.5)
    assert set(stack.server_status().values()) == {"UP"}, stack.server_status()
    before = stack.sessions()
    prompt = token_prompt(600, seed=31)
    direct = complete(stack.ports["a"], prompt, max_tokens=4, use_pool=False)
    answers = [complete(stack.ports["router"], prompt, max_tokens=4) for _ in range(6)]
    assert all(a.tokens == direct.tokens for a in answers)  # greedy: the same tokens wherever it went
    after = stack.sessions()
    served = {name: after[name] - before.get(name, 0) for name in after}
    assert all(n > 0 for n in served.values()), served  # least connections used both instances


def test_prometheus_scrapes_every_target_and_the_dashboard_names_exist(stack: Stack) -> None:
    from tests.ops.test_export_prometheus import query, start_prometheus, wait_all_up
    from tests.support.dashboard_names import dashboard, metric_names, queries, recorded_names

    config = stack.tmp / "prometheus.yml"
    out = _belugactl("export", "prometheus", "-f", str(stack.manifest), "-o", str(config), "--scrape-interval", "1s",
                     timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    prom, port = start_prometheus(config, stack.tmp / "tsdb", stack.tmp / "prometheus.log")
    try:
        targets = wait_all_up(port, expected=4, timeout=90)
        assert {t["labels"]["beluga_instance"] for t in targets} == {
            "metadata-server", "cpu-demo-vllm-0", "cpu-demo-vllm-1", "cpu-demo-router",
        }  # fmt: skip
        deadline = time.monotonic() + 30
        states: set[str] = set()
        while time.monotonic() < deadline and not {"used", "free", "capacity"} <= states:
            states = {s["metric"]["state"] for s in query(port, 'beluga_mds_pool_bytes{rack="cpu-demo"}')}
            time.sleep(0.5)
        assert {"used", "free", "capacity"} <= states
        ttft = query(port, "vllm:time_to_first_token_seconds_count")
        assert {s["metric"]["beluga_instance"] for s in ttft} == {"cpu-demo-vllm-0", "cpu-demo-vllm-1"}
    finally:
        prom.terminate()
        prom.wait(timeout=30)
    # The recorded vLLM names the dashboard reads are what this vLLM really exports.
    live = set()
    for name in ("a", "b"):
        for line in _get(f"http://127.0.0.1:{stack.ports[name]}/metrics").splitlines():
            if line.startswith("vllm:"):
                live.add(line.split("{")[0].split(" ")[0])
    used = {n for _, expr in queries(dashboard()) for n in metric_names(expr) if n.startswith("vllm:")}
    assert used <= recorded_names("vllm_metric_names.txt")
    assert used <= live, used - live


def test_bench_serve_via_router_times_ttft_through_the_front_door(stack: Stack) -> None:
    out = _belugactl("bench", "serve", "-f", str(stack.manifest), "--run-dir", str(stack.run_dir), "--via-router",
                     "--lengths", "2000", "--rounds", "3", "--json", timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    row = doc["rows"][0]
    routed = row["via_router"]
    assert row["same_tokens"] is True
    assert len(routed["samples"]["pool_hit_s"]) == 3
    assert routed["ttft_pool_hit_s"] > 0 and routed["ttft_recompute_s"] > 0
    report = os.environ.get("BELUGA_BENCH_OUT")
    if report:
        Path(report).write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: v for k, v in row.items() if k != "samples"}, indent=2))


# The destructive ones last: the tests above need every process up.
def test_metadata_server_crash_costs_hits_never_answers(stack: Stack) -> None:
    """SIGKILL the metadata server: requests still get the right tokens (misses, recompute); the
    supervisor restarts it (new epoch, empty index), the connectors reconnect, and hits come back."""
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


def test_one_instance_stopped_traffic_continues(stack: Stack) -> None:
    state = read_state(stack.run_dir)
    victim = next(p for p in state["processes"] if p["name"] == "vllm-1")
    os.killpg(victim["pid"], signal.SIGKILL)
    prompt = token_prompt(300, seed=77)
    answers = [complete(stack.ports["router"], prompt, max_tokens=2) for _ in range(6)]  # at once: retried elsewhere
    assert len({tuple(a.tokens) for a in answers}) == 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stack.server_status().get("cpu-demo-vllm-1", "").startswith("UP"):
        time.sleep(0.2)
    assert not stack.server_status()["cpu-demo-vllm-1"].startswith("UP"), stack.server_status()
    before = stack.sessions()
    more = [complete(stack.ports["router"], prompt, max_tokens=2) for _ in range(4)]
    assert [a.tokens for a in more] == [answers[0].tokens] * 4
    after = stack.sessions()
    if not stack.server_status()["cpu-demo-vllm-1"].startswith("UP"):  # not yet restarted by the supervisor
        # each completion is two requests (GET /v1/models, POST /v1/completions): all on the survivor
        assert after["cpu-demo-vllm-0"] - before["cpu-demo-vllm-0"] == 2 * len(more)
        assert after["cpu-demo-vllm-1"] == before["cpu-demo-vllm-1"]
