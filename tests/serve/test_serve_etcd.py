"""serve runs the rack's etcd when the manifest says `serve.metadata.etcd.run: true` (issue 32 item 2):
a member on each host an endpoint names (export systemd's command line, data under the run dir),
started before the metadata server and stopped after it; `rack serve` starts every member host
together. The process test runs a real etcd and a real elected metadata server under the supervisor."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan, Tools, build_serve_plan
from belugactl.workflows.serve.supervisor import Supervisor
from tests.dataplane.test_standby_process import CPU_DEMO
from tests.support.etcd import _free_port, require_etcd

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl=None, etcd="/usr/bin/etcd")
ANCHOR = "    host: lab-1\n"


def _manifest(tmp_path: Path, endpoints: list[str], run: bool = True) -> Path:
    text = (REPO / "examples" / "lab.yaml").read_text()
    conf = json.dumps({"endpoints": endpoints, "candidates": ["lab-1", "lab-2"], "run": run})
    path = tmp_path / "rack.yaml"
    path.write_text(text.replace(ANCHOR, f"{ANCHOR}    etcd: {conf}\n"))
    return path


def _plan(tmp_path: Path, endpoints: list[str], host: str, run: bool = True, tools: Tools = TOOLS) -> ServePlan:
    rack = load_rack_context(_manifest(tmp_path, endpoints, run), host=host, pool="/tmp/lab.pool")
    return build_serve_plan(rack, run_dir="/run/beluga", tools=tools)


def _flag(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_member_host_runs_its_etcd_before_its_metadata_server(tmp_path: Path) -> None:
    three = ["http://10.0.2.15:2379", "http://10.0.2.16:2379", "http://10.0.2.17:2379"]
    plan = _plan(tmp_path, three, "lab-2")
    kinds = [p.kind for p in plan.processes]
    assert kinds.index("etcd") < kinds.index("metadata")
    (etcd,) = [p for p in plan.processes if p.kind == "etcd"]
    assert etcd.argv[0] == "/usr/bin/etcd" and _flag(etcd.argv, "--name") == "lab-2"
    assert _flag(etcd.argv, "--data-dir") == "/run/beluga/etcd"
    assert _flag(etcd.argv, "--listen-client-urls") == "http://10.0.2.16:2379,http://127.0.0.1:2379"
    cluster = _flag(etcd.argv, "--initial-cluster")
    assert "lab-1=http://10.0.2.15:2380" in cluster and "lab-2=http://10.0.2.16:2380" in cluster
    assert "10.0.2.17=http://10.0.2.17:2380" in cluster  # a member on no manifest host keeps its address
    assert etcd.health_url == "http://127.0.0.1:2379/version" and etcd.port == 2379
    assert any("etcd: member lab-2" in n for n in plan.notes), plan.notes
    assert not plan.blockers


def test_no_member_no_run_no_etcd(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ["http://10.0.2.15:2379"], "lab-2")
    assert not [p for p in plan.processes if p.kind == "etcd"]
    assert any("etcd: no member on lab-2" in n for n in plan.notes)
    plan = _plan(tmp_path, ["http://10.0.2.15:2379"], "lab-1", run=False)  # a cluster the operator runs
    assert not [p for p in plan.processes if p.kind == "etcd"]


def test_what_serve_cannot_run_is_a_blocker(tmp_path: Path) -> None:
    no_etcd = Tools(vllm="vllm", belugactl=("belugactl",), numactl=None, etcd=None)
    plan = _plan(tmp_path, ["http://10.0.2.15:2379"], "lab-1", tools=no_etcd)
    assert any("no `etcd` is on PATH" in b and "etcd-server" in b for b in plan.blockers), plan.blockers
    plan = _plan(tmp_path, ["https://10.0.2.15:2379"], "lab-1")
    assert any("https endpoints" in b for b in plan.blockers), plan.blockers


def test_rack_serve_starts_every_member_host_together(tmp_path: Path) -> None:
    from belugactl.workflows.rack.orchestrate import _metadata_first

    def phases(endpoints: list[str], run: bool) -> list[list[str]]:
        m = load_rack_context(_manifest(tmp_path, endpoints, run)).manifest
        return _metadata_first(SimpleNamespace(manifest=m, hosts=["lab-1", "lab-2", "lab-3"], metadata_host="lab-1"))

    assert phases(["http://10.0.2.15:2379"], True) == [["lab-1", "lab-2"], ["lab-3"]]  # member + candidates
    assert phases(["http://10.0.2.15:2379"], False) == [["lab-1"], ["lab-2", "lab-3"]]  # the leader first


def test_the_supervisor_stops_etcd_after_the_metadata_server(monkeypatch) -> None:
    specs = [ProcessSpec(name=k, kind=k, argv=("true",), env={}, log_file="/dev/null") for k in ("etcd", "metadata")]
    sup = Supervisor(ServePlan("r", "h", "m", "/tmp/none", "p", specs), say=lambda _t: None)
    order: list[str] = []
    for m in sup.procs:
        m.proc = SimpleNamespace(wait=lambda timeout=None: 0)  # type: ignore[assignment]
    monkeypatch.setattr(sup, "_terminate", lambda m, grace, sig: order.append(m.spec.name))
    monkeypatch.setattr(sup, "write_state", lambda: None)
    sup.stop()
    assert order == ["metadata", "etcd"]


@pytest.mark.process
def test_serve_runs_a_real_etcd_and_its_elected_server_leads_in_it(tmp_path: Path) -> None:
    require_etcd()
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.workflows.serve.launch_plan import add_etcd_member

    client, admin_port = _free_port(), _free_port()
    text = CPU_DEMO.read_text()
    host = load_manifest(CPU_DEMO).hosts[0].name
    conf = json.dumps(
        {"endpoints": [f"http://127.0.0.1:{client}"], "candidates": [host], "run": True, "leader_ttl_s": 2}
    )
    anchor = "spin_after_ms: 0}"
    assert text.count(anchor) == 1, "the CPU demo's serve.metadata line changed"
    path = tmp_path / "rack.yaml"
    path.write_text(text.replace(anchor, f"spin_after_ms: 0, etcd: {conf}}}"))
    manifest = load_manifest(path)
    pool = tmp_path / "pool"
    create_file_pool(pool, path)
    run = tmp_path / "run"
    plan = ServePlan(manifest.name, host, str(path), str(run), str(pool))
    add_etcd_member(plan, manifest, host, run, require_etcd())
    (etcd,) = plan.processes
    assert etcd.argv[etcd.argv.index("--data-dir") + 1] == str(run / "etcd")
    argv = (sys.executable, "-m", "belugactl", "metadata-server", "-f", str(path), "--pool", str(pool),
            "--rpc-port", "0", "--admin-port", str(admin_port), "--standby", "--member", host)  # fmt: skip
    server = ProcessSpec(
        name="metadata-server", kind="metadata", argv=argv, env={}, log_file=str(run / "logs" / "mds.log"),
        port=admin_port, health_url=f"http://127.0.0.1:{admin_port}/readyz", ready_timeout_s=60.0, standby_ok=True,
    )  # fmt: skip
    plan.processes = [server, etcd]  # listed out of order: the supervisor starts etcd first anyway
    sup = Supervisor(plan, say=lambda _t: None, poll_s=0.05)
    sup.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats", timeout=5) as r:  # noqa: S310 - loopback
            lead = json.loads(r.read())["leadership"]
        assert lead["leading"] and lead["leader"] == host  # it won in the etcd serve started
    finally:
        sup.stop()
    log = (run / "logs" / "mds.log").read_text()
    assert "etcd unreachable" not in log, log[-2000:]  # etcd outlived it: its lease was revoked cleanly
    assert (run / "etcd" / "member").is_dir()


def test_standby_cold_in_the_manifest_starts_cold_standbys(tmp_path: Path) -> None:
    def server_argv(standby: str | None) -> tuple[str, ...]:
        text = (REPO / "examples" / "lab.yaml").read_text()
        conf: dict = {"endpoints": ["http://10.0.2.15:2379"], "candidates": ["lab-1", "lab-2"]}
        if standby:
            conf["standby"] = standby
        path = tmp_path / "rack.yaml"
        path.write_text(text.replace(ANCHOR, f"{ANCHOR}    etcd: {json.dumps(conf)}\n"))
        rack = load_rack_context(path, host="lab-2", pool="/tmp/lab.pool")
        (server,) = [
            p for p in build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS).processes if p.kind == "metadata"
        ]
        return server.argv

    assert "--cold-standby" in server_argv("cold")
    assert "--cold-standby" not in server_argv("warm") and "--cold-standby" not in server_argv(None)
