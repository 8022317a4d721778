"""serve with serve.metadata.etcd: every candidate host runs `metadata-server --standby --member HOST`
(the first candidate too), a host not in candidates runs none, and serve's readiness wait takes a
standby that names its leader as healthy (supervisor.readiness)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from belugactl.errors import ManifestError
from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan, first_leader
from belugactl.workflows.serve.supervisor import readiness

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl=None)
ANCHOR = "    host: lab-1\n"


def _manifest(tmp_path: Path, candidates: list[str] | None, more: str = "") -> Path:
    text = (REPO / "examples" / "lab.yaml").read_text()
    assert text.count(ANCHOR) == 1
    text = text.replace(ANCHOR, ANCHOR + more)
    if candidates is not None:
        conf = json.dumps({"endpoints": ["http://10.0.0.9:2379"], "candidates": candidates, "leader_ttl_s": 4})
        text = text.replace(ANCHOR, f"{ANCHOR}    etcd: {conf}\n")
    path = tmp_path / "rack.yaml"
    path.write_text(text)
    return path


def _server(tmp_path: Path, candidates: list[str] | None, host: str):
    rack = load_rack_context(_manifest(tmp_path, candidates), host=host, pool="/tmp/lab.pool")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    servers = [p for p in plan.processes if p.kind == "metadata"]
    return plan, (servers[0] if servers else None)


def _flag(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_candidate_that_is_not_the_metadata_host_runs_a_standby(tmp_path: Path) -> None:
    plan, server = _server(tmp_path, ["lab-1", "lab-2"], "lab-2")
    assert server is not None and server.argv[:2] == ("/opt/bin/belugactl", "metadata-server")
    assert "--standby" in server.argv and _flag(server.argv, "--member") == "lab-2"
    assert _flag(server.argv, "--etcd") == "http://10.0.0.9:2379" and _flag(server.argv, "--leader-ttl") == "4"
    assert server.standby_ok and server.health_url == "http://127.0.0.1:9470/readyz"
    assert plan.metadata_admin_url == "http://127.0.0.1:9470"  # status reads this host's server
    assert any("lab-2 stands by (lab-1 leads)" in n for n in plan.notes), plan.notes
    assert "standby_ok" in server.to_dict()


def test_the_first_candidate_is_elected_too(tmp_path: Path) -> None:
    plan, server = _server(tmp_path, ["lab-1", "lab-2"], "lab-1")
    assert server is not None and "--standby" in server.argv and _flag(server.argv, "--member") == "lab-1"
    assert any("lab-1 leads when the rack starts" in n for n in plan.notes), plan.notes


def test_a_host_not_in_candidates_runs_no_server(tmp_path: Path) -> None:
    plan, server = _server(tmp_path, ["lab-1"], "lab-2")
    assert server is None and plan.metadata_admin_url is None
    assert any("none on lab-2 (not in serve.metadata.etcd.candidates: lab-1)" in n for n in plan.notes)
    assert [p.name for p in plan.processes if p.kind == "vllm"]  # its vLLM still runs


def test_first_leader_is_the_first_candidate_else_the_metadata_host(tmp_path: Path) -> None:
    assert first_leader(load_rack_context(_manifest(tmp_path, ["lab-2", "lab-1"])).manifest) == "lab-2"
    assert first_leader(load_rack_context(_manifest(tmp_path, None)).manifest) == "lab-1"
    # etcd without candidates: the metadata host alone, elected
    plan, server = _server(tmp_path, [], "lab-1")
    assert server is not None and "--standby" in server.argv


def test_rack_serve_starts_the_first_candidate_alone_first_and_stops_it_last(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from belugactl.workflows.rack.orchestrate import _metadata_first

    def order(candidates: list[str] | None) -> list[list[str]]:
        m = load_rack_context(_manifest(tmp_path, candidates)).manifest
        return _metadata_first(SimpleNamespace(manifest=m, hosts=["lab-1", "lab-2"], metadata_host="lab-1"))

    assert order(["lab-2", "lab-1"]) == [["lab-2"], ["lab-1"]]
    assert order(None) == order([]) == [["lab-1"], ["lab-2"]]


def test_tcp_clients_are_given_every_candidate(tmp_path: Path) -> None:
    more = "    transport: tcp\n    rpc_bind: 0.0.0.0\n"
    rack = load_rack_context(_manifest(tmp_path, ["lab-1", "lab-2"], more), host="lab-2", pool="/tmp/lab.pool")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    (vllm,) = [p for p in plan.processes if p.kind == "vllm"]
    assert dict(vllm.metadata_clients)["scheduler"] == "tcp://10.0.2.15:9471,127.0.0.1:9471"
    rack = load_rack_context(_manifest(tmp_path, None, more), host="lab-2", pool="/tmp/lab.pool")
    (vllm,) = [p for p in build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS).processes if p.kind == "vllm"]
    assert dict(vllm.metadata_clients)["scheduler"] == "tcp://10.0.2.15:9471"  # one server: one address


def test_without_etcd_one_plain_server_on_the_metadata_host(tmp_path: Path) -> None:
    plan, server = _server(tmp_path, None, "lab-1")
    assert server is not None and "--standby" not in server.argv and "--member" not in server.argv
    assert not server.standby_ok
    assert _server(tmp_path, None, "lab-2")[1] is None


def test_a_candidate_that_is_not_a_host_is_refused_with_its_line(tmp_path: Path) -> None:
    path = _manifest(tmp_path, ["lab-1", "lab-9"])
    with pytest.raises(ManifestError) as err:  # refused when the manifest loads (manifest check, serve)
        load_rack_context(path, host="lab-1", pool="/tmp/lab.pool")
    (problem,) = err.value.problems
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "etcd:" in t)
    assert problem.location.line == line and problem.path == "serve.metadata.etcd.candidates[1]"
    assert "'lab-9' is not one of the hosts" in problem.message


@pytest.mark.parametrize(
    "candidates, says",
    [(["lab-1", "lab-9"], "'lab-9' is not one of the hosts"), (["lab-2", "lab-2"], "'lab-2' is listed twice")],
)
def test_manifest_check_refuses_unknown_or_repeated_candidates(tmp_path: Path, capsys, candidates, says) -> None:
    from belugactl.cli.app import run

    path = _manifest(tmp_path, candidates)
    assert run(["manifest", "check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "etcd:" in t)
    assert says in err and f"{path}:{line}:" in err and "Traceback" not in err
    assert run(["manifest", "check", "-f", str(_manifest(tmp_path, ["lab-2", "lab-1"]))]) == 0


class _Readyz(BaseHTTPRequestHandler):
    answer: tuple[int, dict] = (200, {})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        code, body = self.server.answer  # type: ignore[attr-defined]
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        return


def test_readiness_takes_a_standby_that_names_its_leader() -> None:
    httpd = HTTPServer(("127.0.0.1", 0), _Readyz)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/readyz"
    try:
        httpd.answer = (200, {"ready": True})  # type: ignore[attr-defined]
        assert readiness(url, standby_ok=True) == "ready" and readiness(url) == "ready"
        httpd.answer = (503, {"ready": False, "reason": "standby: lab-1 leads", "epoch": 0})  # type: ignore[attr-defined]
        assert readiness(url, standby_ok=True) == "standby: lab-1 leads"
        assert readiness(url) is None  # a plain server's 503 is not ready
        httpd.answer = (503, {"reason": "standby: lab-1 leads (etcd: timed out)"})  # type: ignore[attr-defined]
        assert readiness(url, standby_ok=True) == "standby: lab-1 leads"
        for reason in ("standby: no leader yet, campaigning", "starting: rebuilding the index", None):
            httpd.answer = (503, {"ready": False, "reason": reason})  # type: ignore[attr-defined]
            assert readiness(url, standby_ok=True) is None, reason
        httpd.answer = (500, {"reason": "standby: lab-1 leads"})  # type: ignore[attr-defined]
        assert readiness(url, standby_ok=True) is None
    finally:
        httpd.shutdown()
        httpd.server_close()
