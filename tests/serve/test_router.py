"""The front door: HAProxy's config from the manifest (pure), and the real haproxy in front of two tiny
HTTP servers run by the supervisor: least connections, /health checks, an instance killed, a drained stop.

The real-haproxy tests need the Debian package `haproxy` (scripts/bootstrap installs it); they skip
without it, and fail in CI (CI=true), where it must be present.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from belugactl.cli.app import run
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.router import add_router, backends, haproxy_config, router_hosts, router_process
from belugactl.workflows.serve.supervisor import Supervisor, pid_alive
from tests.support import ROUTER_BACKEND

REPO = Path(__file__).resolve().parents[2]
BACKEND = str(ROUTER_BACKEND)


def _haproxy() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("haproxy is not installed (scripts/bootstrap installs the Debian package)")
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    return found


def _rack(router: dict | None = None, **vllm: object) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "beluga-rack.yaml").read_text())
    doc["serve"]["router"] = router if router is not None else {}
    doc["serve"]["vllm"].update(vllm)
    return doc


def _manifest(doc: dict):  # -> Manifest
    return load_manifest_text(yaml.safe_dump(doc))


# ---- the config, a pure function of the manifest ---------------------------------------------------------


def test_config_balances_every_instance_of_the_rack_by_least_connections() -> None:
    manifest = _manifest(_rack())
    text = haproxy_config(manifest, "/run/x")
    servers = [line.split()[1:3] for line in text.splitlines() if line.strip().startswith("server ")]
    # 16 hosts x 8 instances, each at its host's rack address
    assert len(servers) == 128
    assert servers[0] == ["beluga-00-vllm-0", f"{manifest.hosts[0].address}:8000"]
    assert servers[-1] == ["beluga-15-vllm-7", f"{manifest.hosts[15].address}:8007"]
    assert "    balance leastconn" in text
    assert "    option httpchk GET /health" in text
    assert "    bind 127.0.0.1:8090" in text  # loopback unless the manifest says otherwise
    assert "    bind 127.0.0.1:8404" in text
    assert "hard-stop-after 30s" in text
    assert "stats socket /run/x/haproxy.sock" in text
    assert haproxy_config(manifest, "/run/x") == text  # same manifest, same text


def test_router_host_defaults_to_the_metadata_host_and_can_be_named() -> None:
    assert router_hosts(_manifest(_rack())) == ["beluga-00"]
    assert router_hosts(_manifest(_rack({"hosts": ["beluga-03", "beluga-04"]}))) == ["beluga-03", "beluga-04"]
    doc = _rack()
    del doc["serve"]["router"]
    assert router_hosts(_manifest(doc)) == []


def test_bind_and_check_interval_come_from_the_manifest() -> None:
    manifest = _manifest(_rack({"bind": "10.10.0.11", "port": 80, "check_interval_ms": 500, "drain_timeout_s": 5}))
    text = haproxy_config(manifest, "/run/x")
    assert "    bind 10.10.0.11:80" in text
    assert "default-server inter 500ms" in text
    assert "hard-stop-after 5s" in text
    spec = router_process(manifest, manifest.host("beluga-00"), "/run/x", haproxy="/usr/sbin/haproxy")
    assert spec.argv == ("/usr/sbin/haproxy", "-db", "-f", "/run/x/haproxy.cfg")
    assert spec.files == (("/run/x/haproxy.cfg", text),)
    assert spec.stop_signal == "SIGUSR1" and spec.stop_grace_s == 10.0
    assert spec.health_url == "http://10.10.0.11:8404/healthz"


def test_bad_router_settings_are_refused_with_the_field() -> None:
    from belugactl.errors import ManifestError

    with pytest.raises(ManifestError) as bad_bind:
        _manifest(_rack({"bind": "everywhere"}))
    assert "serve.router.bind" in str(bad_bind.value.why) and "expected an IP address" in str(bad_bind.value.why)
    with pytest.raises(ManifestError) as bad_port:
        _manifest(_rack({"port": 70000}))
    assert "serve.router.port" in str(bad_port.value.why)


def test_bind_address_puts_each_door_on_its_own_hosts_address() -> None:
    """Two front doors (serve.router.bind: address): each binds its host's rack address, so a rolling
    restart always leaves one answering, and Prometheus scrapes each at its own."""
    from belugactl.workflows.export_prometheus import scrape_targets

    manifest = _manifest(_rack({"hosts": ["beluga-03", "beluga-04"], "bind": "address"}))
    for name in ("beluga-03", "beluga-04"):
        host = manifest.host(name)
        spec = router_process(manifest, host, "/run/x", haproxy="/usr/sbin/haproxy")
        text = spec.files[0][1]
        assert f"    bind {host.address}:8090" in text and f"    bind {host.address}:8404" in text
        assert spec.health_url == f"http://{host.address}:8404/healthz"
    doors = [t for t in scrape_targets(manifest)[0] if t.job == "beluga-router"]
    assert [t.address for t in doors] == [f"{manifest.host(h).address}:8404" for h in ("beluga-03", "beluga-04")]


def _plan_for(manifest, host: str) -> ServePlan:
    plan = ServePlan(manifest.name, host, "rack.yaml", "/run/x", "/dev/dax0.0")
    add_router(plan, manifest, haproxy="/usr/sbin/haproxy")
    return plan


def test_only_the_router_hosts_run_it_and_conflicts_block_the_start() -> None:
    manifest = _manifest(_rack())
    assert [p.kind for p in _plan_for(manifest, "beluga-00").processes] == ["router"]
    assert _plan_for(manifest, "beluga-01").processes == []
    unknown = _plan_for(_manifest(_rack({"hosts": ["beluga-99"]})), "beluga-00")
    assert unknown.processes == [] and "beluga-99" in unknown.blockers[0]
    clash = _plan_for(_manifest(_rack({"port": 8003})), "beluga-00")
    assert any("serve.router.port 8003 is also vllm-3's port" in b for b in clash.blockers)


def test_dry_run_shows_the_haproxy_config(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["serve"]["router"] = {"port": 18090, "stats_port": 18404}
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    code = run(["serve", "-f", str(manifest), "--pool", str(tmp_path / "pool"), "--run-dir", str(tmp_path / "run"),
                "--dry-run"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert f"-db -f {tmp_path / 'run' / 'haproxy.cfg'}" in out
    assert "#       server cpu-demo-vllm-0 127.0.0.1:8100 check" in out
    assert "#       server cpu-demo-vllm-1 127.0.0.1:8101 check" in out
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


@pytest.mark.process
def test_generated_configs_pass_haproxys_own_check(tmp_path: Path) -> None:
    haproxy = _haproxy()
    for doc in (_rack(), _rack({"bind": "::1"})):
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(haproxy_config(_manifest(doc), tmp_path))
        checked = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr


# ---- the real haproxy in front of two tiny HTTP servers ---------------------------------------------------


def _free_pair() -> int:
    """A base port with base and base + 1 free (instances take port_base + i)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base >= 65000:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback test URLs
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


class Front:
    def __init__(self, sup: Supervisor, base: int, port: int, stats: int) -> None:
        self.sup, self.base, self.port, self.stats = sup, base, port, stats

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def pid(self, name: str) -> int:
        m = next(m for m in self.sup.procs if m.spec.name == name)
        assert m.proc is not None
        return m.proc.pid

    def server_status(self) -> dict[str, str]:
        """HAProxy's own view of each backend server (its stats CSV)."""
        code, text = _get(f"http://127.0.0.1:{self.stats}/stats;csv")
        assert code == 200
        rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
        return {r[1]: r[17] for r in rows if r[0] == "vllm" and r[1] not in ("BACKEND", "FRONTEND")}


@pytest.fixture
def front(tmp_path: Path):
    haproxy = _haproxy()
    base, port, stats = _free_pair(), _free(), _free()
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["serve"]["vllm"]["port_base"] = base
    doc["serve"]["router"] = {"port": port, "stats_port": stats, "check_interval_ms": 200, "drain_timeout_s": 10}
    path = tmp_path / "rack.yaml"
    path.write_text(yaml.safe_dump(doc))
    manifest = load_manifest(path)
    names = [b.name for b in backends(manifest)]
    specs = [
        ProcessSpec(
            name=f"vllm-{i}", kind="vllm", argv=(sys.executable, BACKEND, str(base + i), names[i]), env={},
            log_file=str(tmp_path / "logs" / f"vllm-{i}.log"), port=base + i,
            health_url=f"http://127.0.0.1:{base + i}/health", ready_timeout_s=20,
        )
        for i in range(2)
    ]  # fmt: skip
    plan = ServePlan("cpu-demo", "cpu-demo", str(path), str(tmp_path / "run"), "/tmp/pool", specs)
    add_router(plan, manifest, haproxy=haproxy)
    assert not plan.blockers, plan.blockers
    sup = Supervisor(plan, say=lambda _: None, poll_s=0.05, backoff_s=60.0)
    sup.start()
    try:
        yield Front(sup, base, port, stats)
    finally:
        sup.stop()
        assert not any(pid_alive(m.proc.pid) for m in sup.procs if m.proc is not None)


def _wait_status(front: Front, want: dict[str, str], timeout: float = 10.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        seen = front.server_status()
        if all(seen.get(k, "").startswith(v) for k, v in want.items()):
            return seen
        time.sleep(0.1)
    pytest.fail(f"haproxy's server status stayed {seen}, wanted {want}")


def _wait_sessions(front: Front, ok: Callable[[dict[str, int]], bool], timeout: float = 10.0) -> dict[str, int]:
    """haproxy's own count of requests in progress per instance, once `ok` accepts it."""
    deadline = time.monotonic() + timeout
    held: dict[str, int] = {}
    while time.monotonic() < deadline:
        body = _get(f"http://127.0.0.1:{front.stats}/metrics")[1]
        held = {
            line.split('server="')[1].split('"')[0]: int(float(line.rsplit(" ", 1)[1]))
            for line in body.splitlines()
            if line.startswith("haproxy_server_current_sessions{") and 'proxy="vllm"' in line
        }
        if ok(held):
            return held
        time.sleep(0.05)
    pytest.fail(f"haproxy's sessions per instance stayed {held}")


@pytest.mark.process
def test_least_connections_sends_new_requests_past_a_busy_instance(front: Front) -> None:
    _wait_status(front, {"cpu-demo-vllm-0": "UP", "cpu-demo-vllm-1": "UP"})
    answers = {_get(front.url("/who"))[1] for _ in range(4)}
    assert answers == {"cpu-demo-vllm-0", "cpu-demo-vllm-1"}  # both serve

    slow: list[tuple[int, str]] = []
    # The request holds its instance until the quick ones are out, however long a loaded machine
    # takes to send them: it answers when told to (/let-go), not after a fixed time.
    holder = threading.Thread(target=lambda: slow.append(_get(front.url("/hold"), timeout=90)))
    holder.start()
    # Wait until an instance is inside the slow request: haproxy has then dispatched it and counts it
    # on that instance until it answers. (Waiting on haproxy's own session gauge raced: a quick
    # request's session that had not closed yet counted too, and a fixed sleep was flaky under load.)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        inside = [_get(f"http://127.0.0.1:{front.base + i}/inflight")[1] for i in range(2)]
        if "1" in inside:
            break
        time.sleep(0.05)
    else:
        pytest.fail("no instance ever got the slow request")
    started = time.monotonic()
    quick = []
    for _ in range(6):
        # haproxy counts a finished request until it has closed the stream, which on a loaded machine
        # can come after the client got its answer: wait for that, or the next request meets a tie.
        _wait_sessions(front, lambda held: sum(held.values()) == 1)
        quick.append(_get(front.url("/who")))
    quick_s = time.monotonic() - started
    for i in range(2):
        _get(f"http://127.0.0.1:{front.base + i}/let-go")
    holder.join(timeout=60)
    assert slow and slow[0][0] == 200
    busy = slow[0][1]
    assert all(code == 200 for code, _ in quick)
    assert {who for _, who in quick} == {"cpu-demo-vllm-0", "cpu-demo-vllm-1"} - {busy}, (quick, busy, quick_s)


@pytest.mark.process
def test_a_killed_instance_is_marked_down_and_requests_still_succeed(front: Front) -> None:
    _wait_status(front, {"cpu-demo-vllm-0": "UP", "cpu-demo-vllm-1": "UP"})
    front.sup.procs[0].status = "failed"  # keep the supervisor from restarting it during the test
    os.killpg(front.pid("vllm-0"), signal.SIGKILL)
    # At once, before any health check noticed: a refused connection is retried on the other instance.
    answers = [_get(front.url("/who")) for _ in range(10)]
    assert answers == [(200, "cpu-demo-vllm-1")] * 10
    _wait_status(front, {"cpu-demo-vllm-0": "DOWN", "cpu-demo-vllm-1": "UP"})
    code, body = _get(f"http://127.0.0.1:{front.stats}/metrics")
    assert code == 200 and "haproxy_server_status" in body
    # The shipped dashboard's router panels read names this haproxy really exports.
    import re
    from importlib.resources import files

    used = set(re.findall(r"haproxy_[a-z_]+", files("belugactl").joinpath("data/grafana/belugactl.json").read_text()))
    exported = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line.startswith("haproxy_")}
    assert used and used <= exported, used - exported


def _post(url: str, body: dict, timeout: float = 20.0) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - loopback test URLs
            return resp.status, resp.headers.get("X-Backend", "")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.mark.process
def test_an_instance_dying_with_queued_connections_costs_a_retry_not_an_error(front: Front) -> None:
    """A SIGKILLed vLLM keeps its listening socket while the kernel tears down its memory: handshakes
    complete into the backlog, HAProxy sends the request, then the socket closes and resets it. Those
    requests (a POST with a body among them) must be replayed on the other instance, not answered 502."""
    _wait_status(front, {"cpu-demo-vllm-0": "UP", "cpu-demo-vllm-1": "UP"})
    front.sup.procs[0].status = "failed"  # keep the supervisor from restarting it during the test
    assert _get(f"http://127.0.0.1:{front.base}/die-slowly?s=1.5") == (200, "dying")
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        if i % 2:
            answer = _post(front.url("/v1/completions"), {"model": "demo", "prompt": list(range(300))})
        else:
            answer = _get(front.url("/who"), timeout=20)
        with lock:
            results.append(answer)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]  # at once: leastconn spreads them
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 8
    assert all(code == 200 for code, _ in results), results
    assert {who for _, who in results} == {"cpu-demo-vllm-1"}
    log = (Path(front.sup.plan.run_dir) / "logs" / "router.log").read_text()
    assert "/+" in log, log[-2000:]  # redispatched requests are logged (retries field "+N")


@pytest.mark.process
def test_stop_drains_in_flight_requests_and_closes_the_door(front: Front) -> None:
    _wait_status(front, {"cpu-demo-vllm-0": "UP", "cpu-demo-vllm-1": "UP"})
    slow: list[tuple[int, str]] = []
    holder = threading.Thread(target=lambda: slow.append(_get(front.url("/slow?s=2"))))
    holder.start()
    time.sleep(0.5)
    router = next(m for m in front.sup.procs if m.spec.kind == "router")
    assert router.proc is not None
    os.killpg(router.proc.pid, signal.SIGUSR1)  # what stop sends it
    time.sleep(0.3)
    with pytest.raises(OSError):  # the listener is closed at once: no new requests
        socket.create_connection(("127.0.0.1", front.port), timeout=2).close()
    assert router.proc.poll() is None  # but it waits for the request in flight
    holder.join(timeout=20)
    assert slow and slow[0][0] == 200
    router.proc.wait(timeout=10)  # and then exits on its own
    router.status = "stopped"


@pytest.mark.process
def test_bench_serve_via_router_times_the_front_door_beside_the_direct_path(front: Front) -> None:
    from belugactl.workflows.bench import serving as bench_serve

    _wait_status(front, {"cpu-demo-vllm-0": "UP", "cpu-demo-vllm-1": "UP"})
    doc = bench_serve.run(front.base, front.base + 1, lengths=[64], rounds=2, settle_s=0.0, router_port=front.port)
    assert doc["router_port"] == front.port
    row = doc["rows"][0]
    routed = row["via_router"]
    assert len(routed["samples"]["recompute_s"]) == len(routed["samples"]["pool_hit_s"]) == 2
    assert all(t > 0 for t in routed["samples"]["pool_hit_s"])
    assert routed["router_cost_pool_hit_s"] == pytest.approx(routed["ttft_pool_hit_s"] - row["ttft_pool_hit_s"])
    assert row["same_tokens"] is True
    without = bench_serve.run(front.base, front.base + 1, lengths=[64], rounds=1, settle_s=0.0)
    assert "via_router" not in without["rows"][0] and without["router_port"] is None
