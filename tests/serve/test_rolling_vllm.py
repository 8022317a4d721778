"""`rack serve --rolling` on a real two-host stack: real vLLM on CPU, the real metadata server with
its journal, HAProxy on both hosts (serve.router.bind: address), one file pool that both map.

The two "hosts" are this machine: roll-a at 127.0.0.1 (metadata server, one vLLM instance, a front
door) and roll-b at 127.0.0.2 (one instance, the other front door); each runs belugactl with its own
run dir (the transport sets BELUGACTL_RUN_DIR), as two machines would each have their own. Checked:
- while the roll restarts one host after the other, requests sent to the front doors (the other
  door when one refuses, as a client with two door addresses does) are all answered, none fails;
- a prompt that hit the pool before the roll hits it after, every full block, with the same tokens
  (the index came back from the journal; nothing was recomputed);
- the roll went host by host, the metadata server's host first (it leads no election here, and its
  door is one of two), and `stop` leaves nothing running.

Slow (four engine starts): marked `vllm`. In CI (CI=true) a missing vLLM venv or haproxy fails it.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from belugactl.errors import EnvironmentProblem
from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.rack.fanout import CommandTransport
from belugactl.workflows.rack.orchestrate import RackTarget, rack_serve, rack_serve_rolling
from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.supervisor import pid_alive
from belugactl.workflows.serve.traffic import complete, prompt_token_sources, token_prompt
from tests.support.etcd import _free_port
from tests.support.needs import need

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
HOSTS = {"roll-a": "127.0.0.1", "roll-b": "127.0.0.2"}
PROMPT_TOKENS = 640
BLOCK = 32
FULL_BLOCKS = (PROMPT_TOKENS - 1) // BLOCK  # the last prompt token is always computed
WARM = 3  # prompts computed and saved before the roll
SHORT_TOKENS = 100  # the new prompts sent during the roll
PAUSE_S = 1.0  # between two requests of the traffic during the roll


class HostRunDirs(CommandTransport):
    """Each host's belugactl on this machine, with that host's own run dir and its own core: vLLM's
    CPU backend pins its threads, and two engines pinned to the same core starve each other (an
    engine that has served recently keeps its core busy, and the other's start took minutes)."""

    def __init__(self, root: Path) -> None:
        super().__init__(prefix=[])
        self.root = root

    def argv(self, host: str, remote: Sequence[str]) -> list[str]:
        core = list(HOSTS).index(host) % (os.cpu_count() or 1)
        return ["env", f"BELUGACTL_RUN_DIR={self.root / host}", f"VLLM_CPU_OMP_THREADS_BIND={core}", *remote]


@dataclass
class Doors:
    """A client of the front door with both door addresses: the next one when one refuses."""

    port: int
    sent: int = 0
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    switched: int = 0  # requests that a refusing door sent to the other one

    def complete(self, prompt: list[int]) -> list[int]:
        self.sent += 1
        last = ""
        for i, address in enumerate(HOSTS.values()):
            try:
                tokens = complete(self.port, prompt, max_tokens=4, address=address, model="demo", timeout=300).tokens
            except EnvironmentProblem as exc:
                last = str(exc)
                if "did not answer" in last:  # refused: that door is down, the other carries it
                    continue
                break
            self.answered += 1
            self.switched += i
            return tokens
        self.failures.append(last)
        return []


def _manifest(tmp: Path, vllm_port: int, router: int, stats: int, admin: int, rpc: int) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["name"] = "roll-demo"
    one = doc["hosts"][0]
    doc["hosts"] = [
        {**one, "name": "roll-a", "address": HOSTS["roll-a"], "instances": 1},
        {**one, "name": "roll-b", "address": HOSTS["roll-b"], "roles": ["worker"], "instances": 1},
    ]
    # A file pool restarts empty unless told: the rolling restart keeps the index through the journal.
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc, restart_policy="journal")
    vllm = doc["serve"]["vllm"]
    vllm.update(port_base=vllm_port, model=str(REPO / "examples" / "models" / "llama-cpu-demo"))
    vllm["extra_args"] = [a for a in vllm["extra_args"] if not a.startswith("--host")]  # the host's address
    vllm["extra_args"] += ["--served-model-name=demo"]
    doc["serve"]["router"] = {
        "hosts": list(HOSTS), "bind": "address", "port": router, "stats_port": stats,
        "check_interval_ms": 500, "drain_timeout_s": 20,
    }  # fmt: skip
    path = tmp / "rack.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Rack:
    target: RackTarget
    runs: Path
    doors: Doors
    admin: int
    vllm_port: int
    extra: list[str]

    def sources(self) -> dict[str, float]:
        """vLLM's prompt tokens by source, summed over both instances."""
        out: dict[str, float] = {}
        for address in HOSTS.values():
            for k, v in prompt_token_sources(self.vllm_port, address=address).items():
                out[k] = out.get(k, 0.0) + v
        return out


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rack]:
    venv = Path(os.environ.get("BELUGA_VLLM_VENV", REPO / ".venv-vllm"))
    missing = f"the vLLM venv is missing ({venv}); create it with scripts/bootstrap-vllm"
    need((venv / "bin" / "python").exists(), missing)
    need(shutil.which("haproxy") is not None, "haproxy is not installed (scripts/bootstrap installs it)")
    tmp = tmp_path_factory.mktemp("rolling")
    vllm_port, router, stats, admin, rpc = (_free_port() for _ in range(5))
    manifest = _manifest(tmp, vllm_port, router, stats, admin, rpc)
    pool = create_file_pool(tmp / "pool", manifest)
    runs = tmp / "run"
    ctx = load_rack_context(manifest)
    target = RackTarget(
        rack=ctx,
        hosts=list(HOSTS),
        transport=HostRunDirs(runs),
        remote_belugactl=[sys.executable, "-m", "belugactl"],
        fanout=2,
        timeout_s=900,
        pool=str(pool),
    )
    extra = ["--vllm", str(venv / "bin" / "vllm-beluga")]
    started = rack_serve(target, dry_run=False, extra=extra)
    try:
        assert not started.failed, {h: (r.returncode, r.stderr[-3000:]) for h, r in started.results.items()}
        yield Rack(target, runs, Doors(router), admin, vllm_port, extra)
    finally:
        for host in HOSTS:
            out = target.run([host], lambda h: target.cmd("stop", "--json"), phase="stop")[host]
            state = read_state(runs / host) or {}
            left = [p["name"] for p in state.get("processes", []) if pid_alive(p.get("pid"))]
            assert out.returncode == 0, out.stderr[-2000:]
            assert not left, f"{host}: still running after stop: {left}"


def _warm_pass(rack: Rack, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """Every prompt once through the doors: the answers and the tokens loaded from the pool."""
    before = rack.sources()
    answers = [rack.doors.complete(p) for p in prompts]
    after = rack.sources()
    return answers, after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)


def test_rolling_restart_keeps_traffic_and_the_pool_hit_rate(rack: Rack) -> None:
    prompts = [token_prompt(PROMPT_TOKENS, seed=20261207 + i) for i in range(WARM)]
    computed, _ = _warm_pass(rack, prompts)
    assert all(computed), rack.doors.failures
    time.sleep(3)  # saves finish off the request's path
    hits_before, loaded_before = _warm_pass(rack, prompts)
    assert loaded_before == WARM * FULL_BLOCKS * BLOCK, "the warm prompts did not all hit before the roll"
    assert hits_before == computed

    # Traffic through the doors for the whole roll: the warm prompts and short new ones, one at a time
    # with a pause between them (both hosts share this machine's two cores).
    stop = threading.Event()
    answers: dict[int, list[list[int]]] = {}

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            which = i % (WARM + 1)
            prompt = prompts[which] if which < WARM else token_prompt(SHORT_TOKENS, seed=1000 + i)
            tokens = rack.doors.complete(prompt)
            if which < WARM and tokens:
                answers.setdefault(which, []).append(tokens)
            i += 1
            stop.wait(PAUSE_S)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        run = rack_serve_rolling(rack.target, dry_run=False, extra=rack.extra)
    finally:
        stop.set()
        sender.join(timeout=600)
    assert not run.failed, {h: (r.returncode, r.stderr[-3000:]) for h, r in run.results.items()}
    assert run.order == [["roll-a"], ["roll-b"]]  # the metadata server's host first; both are doors
    doors = rack.doors
    failed = f"{len(doors.failures)} of {doors.sent} requests failed during the roll: {doors.failures[:3]}"
    assert not doors.failures, failed
    assert doors.answered >= 6, f"only {doors.answered} requests were answered during the roll"
    # No reader got wrong bytes: every answer to a warm prompt, loaded or computed, is the same tokens.
    assert all(t == computed[w] for w, ts in answers.items() for t in ts)

    print(
        f"rolling restart: {doors.sent} requests during the roll, {doors.answered} answered, {doors.switched} by "
        f"the other door; warm prompts answered {sum(map(len, answers.values()))} times, loaded before "
        f"{loaded_before:.0f} tokens"
    )
    hits_after, loaded_after = _warm_pass(rack, prompts)
    assert hits_after == computed
    assert loaded_after == loaded_before, f"loaded after the roll: {loaded_after} tokens, before: {loaded_before}"
