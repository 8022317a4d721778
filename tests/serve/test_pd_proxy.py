"""Prefill/decode disaggregation: kv_roles in the manifest (rules with file:line), the roles serve gives
each instance, and the front door (workflows/serve/pd_proxy.py) in front of stand-in instances on
loopback: prefill first (one token, not streamed), then the consumer's answer relayed as it comes;
failures of either side, and hostile requests, never stop it serving."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from belugactl.cli.app import run
from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.serve.launch_plan import ServePlan
from belugactl.workflows.serve.pd_proxy import MAX_BODY, PdProxy, make_server
from belugactl.workflows.serve.router import add_router, backends

REPO = Path(__file__).resolve().parents[2]


def _demo(**vllm: object) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["serve"]["router"] = {"port": 18090, "stats_port": 18404}
    doc["serve"]["vllm"].update(vllm)
    return doc


# ---- the manifest -----------------------------------------------------------------------------------


def test_roles_go_to_the_instances_and_the_front_door_becomes_the_pd_proxy() -> None:
    manifest = load_manifest_text(yaml.safe_dump(_demo(kv_roles=["kv_producer", "kv_consumer"])))
    assert [b.kv_role for b in backends(manifest)] == ["kv_producer", "kv_consumer"]
    plan = ServePlan(manifest.name, manifest.hosts[0].name, "rack.yaml", "/run/x", "/tmp/pool")
    add_router(plan, manifest)
    (router,) = plan.processes
    argv = list(router.argv)
    assert "pd-proxy" in argv and "haproxy" not in " ".join(argv)
    assert argv[argv.index("--prefill") + 1] == "http://127.0.0.1:8100"
    assert argv[argv.index("--decode") + 1] == "http://127.0.0.1:8101"
    assert argv.count("--prefill") == 1 and argv.count("--decode") == 1
    assert router.health_url == "http://127.0.0.1:18090/healthz"
    assert router.files == ()
    # Without roles the front door stays HAProxy.
    plain = load_manifest_text(yaml.safe_dump(_demo()))
    plan = ServePlan(plain.name, plain.hosts[0].name, "rack.yaml", "/run/x", "/tmp/pool")
    add_router(plan, plain, haproxy="/usr/sbin/haproxy")
    assert plan.processes[0].argv[0] == "/usr/sbin/haproxy"


def test_serve_gives_each_instance_its_kv_role(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _demo(kv_roles=["kv_producer", "kv_consumer"])
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
    path = tmp_path / "rack.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = run(["serve", "-f", str(path), "--pool", str(tmp_path / "pool"), "--dry-run", "--json"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    roles = {}
    for proc in plan["processes"]:
        if proc["kind"] == "vllm":
            config = json.loads(proc["argv"][proc["argv"].index("--kv-transfer-config") + 1])
            roles[proc["name"]] = config["kv_role"]
    assert roles == {"vllm-0": "kv_producer", "vllm-1": "kv_consumer"}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"kv_roles": ["kv_producer", "kv_consumer"], "_no_router": True}, "need the front door"),
        ({"kv_roles": ["kv_producer", "kv_producer"]}, "no instance is kv_consumer"),
        ({"kv_roles": ["kv_consumer", "kv_consumer"]}, "no instance is kv_producer"),
        ({"kv_roles": ["kv_producer", "kv_consumer", "kv_consumer"]}, "3 roles listed"),
        ({"kv_roles": ["prefill", "kv_consumer"]}, "kv_producer"),
    ],
)
def test_bad_roles_are_refused_at_their_line(change: dict, says: str) -> None:
    doc = _demo(**{k: v for k, v in change.items() if not k.startswith("_")})
    if change.get("_no_router"):
        del doc["serve"]["router"]
    with pytest.raises(ManifestError) as err:
        load_manifest_text(yaml.safe_dump(doc), file="rack.yaml")
    text = f"{err.value} {err.value.why} {getattr(err.value, 'fix', '')}"
    assert says in text
    assert "serve.vllm.kv_roles" in text
    assert "rack.yaml:" in text  # file:line


def test_kv_both_instances_count_as_either_side() -> None:
    manifest = load_manifest_text(yaml.safe_dump(_demo(kv_roles=["kv_producer"])))  # vllm-1 stays kv_both
    plan = ServePlan(manifest.name, manifest.hosts[0].name, "rack.yaml", "/run/x", "/tmp/pool")
    add_router(plan, manifest)
    argv = list(plan.processes[0].argv)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"] == [
        "http://127.0.0.1:8100",
        "http://127.0.0.1:8101",
    ]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == ["http://127.0.0.1:8101"]


# ---- the proxy, in front of stand-in instances ------------------------------------------------------------


class Upstream:
    """A stand-in vLLM instance: records what it was sent; answers JSON, or server-sent events."""

    def __init__(self, name: str, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.seen: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a: object) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802
                body = json.dumps({"data": [{"id": "demo"}], "from": outer.name}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append((self.path, doc))
                if doc.get("stream"):
                    self.send_response(outer.status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(3):
                        event = f"data: {json.dumps({'token': i, 'from': outer.name})}\n\n".encode()
                        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"5\r\ndone\n\r\n0\r\n\r\n")
                    return
                body = json.dumps({"from": outer.name, "max_tokens": doc.get("max_tokens")}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens here once closed


@pytest.fixture
def front() -> Iterator[dict]:
    producer, consumer = Upstream("p"), Upstream("c")
    proxy = PdProxy([_dead_url(), producer.url], [_dead_url(), consumer.url], timeout_s=10)
    server = make_server(proxy, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "p": producer, "c": consumer, "proxy": proxy}
    server.shutdown()
    server.server_close()
    producer.close()
    consumer.close()


def _post(url: str, doc: object, *, raw: bytes | None = None) -> tuple[int, bytes, str]:
    data = raw if raw is not None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def test_a_completion_is_prefilled_on_a_producer_then_answered_by_a_consumer(front: dict) -> None:
    body = {"model": "demo", "prompt": [1, 2, 3], "max_tokens": 16, "stream": False, "temperature": 0}
    for _ in range(2):  # the dead instances are skipped whichever comes first in turn
        status, out, _ = _post(front["url"] + "/v1/completions", body)
        assert status == 200
        assert json.loads(out) == {"from": "c", "max_tokens": 16}
    prefills = front["p"].seen
    assert [(p, d["max_tokens"], d["stream"], d["prompt"]) for p, d in prefills] == [
        ("/v1/completions", 1, False, [1, 2, 3])
    ] * 2
    assert [d for _, d in front["c"].seen] == [body, body]  # the consumer gets the request as sent
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    assert _post(front["url"] + "/v1/chat/completions", chat)[0] == 200
    path, sent = front["p"].seen[-1]
    assert path == "/v1/chat/completions" and sent["max_completion_tokens"] == 1 and sent["max_tokens"] == 1


def test_a_streamed_answer_is_relayed_event_by_event(front: dict) -> None:
    status, out, ctype = _post(front["url"] + "/v1/completions", {"prompt": [5], "max_tokens": 3, "stream": True})
    assert status == 200 and ctype == "text/event-stream"
    events = [line for line in out.decode().splitlines() if line.startswith("data: ")]
    assert [json.loads(e.removeprefix("data: "))["token"] for e in events] == [0, 1, 2]
    assert out.decode().endswith("done\n")
    assert front["p"].seen[-1][1]["stream"] is False  # the prefill is never streamed


def test_a_failed_prefill_still_answers_and_is_counted(front: dict) -> None:
    front["p"].status = 500
    status, out, _ = _post(front["url"] + "/v1/completions", {"prompt": [1], "max_tokens": 2})
    assert status == 200 and json.loads(out)["from"] == "c"  # the consumer computed the prompt itself
    metrics = urllib.request.urlopen(front["url"] + "/metrics", timeout=10).read().decode()  # noqa: S310
    assert "beluga_pd_prefill_failures_total 1.0" in metrics
    assert 'beluga_pd_requests_total{outcome="ok"} 1.0' in metrics


def test_no_consumer_means_502_and_the_proxy_keeps_serving(front: dict) -> None:
    front["c"].close()
    status, out, _ = _post(front["url"] + "/v1/completions", {"prompt": [1]})
    assert status == 502 and b"no consumer" in out
    assert urllib.request.urlopen(front["url"] + "/healthz", timeout=10).status == 200  # noqa: S310


def test_hostile_requests_get_4xx_and_never_reach_an_instance(front: dict) -> None:
    url = front["url"]
    cases = [
        (url + "/v1/completions", b"{not json"),
        (url + "/v1/completions", b"[1, 2, 3]"),
        (url + "/v1/completions", b"\xff\xfe\x00"),
        (url + "/admin/shutdown", b"{}"),
    ]
    for _round in range(20):
        for target, raw in cases:
            status, _, _ = _post(target, None, raw=raw)
            assert status in (400, 404)
    # A body announced larger than the cap is refused before it is read.
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode())
        assert b" 413 " in s.recv(4096).split(b"\r\n", 1)[0] + b" "
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
        assert b"413" in s.recv(4096).split(b"\r\n", 1)[0]
    assert front["p"].seen == [] and front["c"].seen == []
    assert _post(url + "/v1/completions", {"prompt": [1]})[0] == 200  # still serving


def test_models_come_from_a_consumer(front: dict) -> None:
    with urllib.request.urlopen(front["url"] + "/v1/models", timeout=10) as r:  # noqa: S310
        assert json.loads(r.read())["from"] == "c"


def test_bad_urls_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["pd-proxy", "--prefill", "ftp://x", "--decode", "http://127.0.0.1:1"]) == 2
    assert "expected http://HOST:PORT" in capsys.readouterr().err
