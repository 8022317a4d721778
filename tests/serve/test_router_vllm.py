"""The front door and the observability stack with real parts, in front of the CPU demo's two real vLLM
instances: `belugactl serve` starts the metadata server, both instances and HAProxy (serve.router);
requests go through the front door to both instances; the real Prometheus scrapes every target of
`belugactl export prometheus`; `bench serve --via-router` times TTFT through it; one instance is
stopped and traffic through the front door continues; `stop` drains the router and leaves nothing.

Slow (two engine starts): marked `vllm`. In CI (CI=true) a missing vLLM venv, haproxy or prometheus
fails these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.supervisor import pid_alive
from belugactl.workflows.serve.traffic import complete, token_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _need(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _free_ports(n: int) -> list[int]:
    from tests.serve.test_e2e_vllm import _free_ports as free

    return free(n)


def _belugactl(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own CLI, argv list
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback test URLs
        return resp.read().decode()


@dataclass
class Stack:
    manifest: Path
    run_dir: Path
    tmp: Path
    ports: dict[str, int]

    def sessions(self) -> dict[str, int]:
        """HAProxy's total sessions per backend server (its stats CSV, column stot)."""
        rows = [line.split(",") for line in _get(f"http://127.0.0.1:{self.ports['stats']}/stats;csv").splitlines()]
        return {r[1]: int(r[7] or 0) for r in rows if r and r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}

    def server_status(self) -> dict[str, str]:
        rows = [line.split(",") for line in _get(f"http://127.0.0.1:{self.ports['stats']}/stats;csv").splitlines()]
        return {r[1]: r[17] for r in rows if r and r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    _need(
        (venv / "bin" / "python").exists(), f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
    )
    _need(shutil.which("haproxy") is not None, "haproxy is not installed (scripts/bootstrap installs it)")
    _need(shutil.which("prometheus") is not None, "prometheus is not installed (scripts/bootstrap installs it)")
    tmp = tmp_path_factory.mktemp("front-door")
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
        yield Stack(manifest, run_dir, tmp, ports)
    finally:
        stopped = _belugactl("stop", "--run-dir", str(run_dir), timeout=180)
        state = read_state(run_dir) or {}
        left = [p["name"] for p in state.get("processes", []) if pid_alive(p.get("pid"))]
        assert stopped.returncode == 0, stopped.stderr
        assert not left, f"still running after stop: {left}"


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
