"""`belugactl doctor --push-poison URL`: the report reaches a real metadata server's POST /poison (a
file pool), the server's answer is printed, and a server that cannot be reached is exit 3 with
doctor's own output kept."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.cli.doctor_cmd import PoisonPush
from belugactl.dataplane.rpc import auth
from belugactl.pool.mapping import PoolMapping
from tests.support.mds_process import cpu_demo_mds

FIXTURE = str(Path(__file__).resolve().parents[1] / "fixtures" / "beluga-intel")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_the_report_reaches_the_server_and_its_answer_is_printed(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv(auth.ENV_KEY_FILE, raising=False)
    expected = run(["doctor", "--root", FIXTURE])
    capsys.readouterr()
    with cpu_demo_mds(tmp_path) as m:
        admin = m.record["admin"]
        code = run(["doctor", "--root", FIXTURE, "--push-poison", admin])
        out = capsys.readouterr().out
        assert code == expected  # the checks' verdict, unchanged by the push
        assert "belugactl doctor on" in out and f"pushed the poison report to {admin}/poison" in out
        assert "queued 0 range(s)" in out  # a fixture tree's report names no pool range

        # --json: stdout stays one document; the answer goes to stderr.
        run(["doctor", "--root", FIXTURE, "--json", "--push-poison", admin + "/"])
        got = capsys.readouterr()
        assert json.loads(got.out)["checks"] and "queued 0 range(s)" in got.err

        # A report that names a poisoned pool line: the server queues it, and drops what lies there.
        pool = PoolMapping.open(m.pool_path)
        kv = pool.geometry.shared_kv_offset
        pool.close()
        report = {"checks": [{"id": "cxl.media-errors", "details": {"poisoned_pool_ranges": [
            {"offset": kv + 4096, "length": 64}]}}]}  # fmt: skip
        assert PoisonPush.prepare(admin, None).send(report)["queued"] == 1
        assert "queued 1 range(s)" in capsys.readouterr().out
        for _ in range(200):  # /stats is the loop's snapshot: it counts the pushes at its next turn
            poison = m.stats()["poison"]
            if poison["pushes"] >= 3:
                break
            time.sleep(0.025)
        assert poison["pushes"] == 3 and poison["ranges_received"] == 1, poison


@pytest.mark.process
def test_a_server_that_cannot_be_reached_is_exit_3_and_the_checks_are_still_shown(capsys) -> None:  # noqa: ANN001
    url = f"http://127.0.0.1:{_free_port()}"
    assert run(["doctor", "--root", FIXTURE, "--push-poison", url]) == 3
    got = capsys.readouterr()
    assert "belugactl doctor on" in got.out  # doctor's own output is kept
    assert f"cannot reach {url}/poison" in got.err


def test_beyond_loopback_without_the_rack_secret_is_refused_before_anything_is_sent(
    capsys,
    monkeypatch,  # noqa: ANN001
) -> None:
    monkeypatch.delenv(auth.ENV_KEY_FILE, raising=False)
    assert run(["doctor", "--root", FIXTURE, "--push-poison", "http://192.0.2.1:9470"]) == 3
    assert "signed with the rack secret" in capsys.readouterr().err
    assert run(["doctor", "--root", FIXTURE, "--push-poison", "ftp://127.0.0.1/x"]) == 2


def test_a_signed_push_carries_the_admin_signature(tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    key_file = tmp_path / "rack.secret"
    cred = auth.create_secret(str(key_file), rack="t")
    monkeypatch.setenv(auth.ENV_KEY_FILE, str(key_file))
    push = PoisonPush.prepare("http://192.0.2.1:9470", None)
    assert push.key == cred.key and push.url == "http://192.0.2.1:9470/poison"

    seen: list[tuple[str | None, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers.get(auth.ADMIN_HEADER), body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"queued": 0}')

        def log_message(self, *_a: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.handle_request, daemon=True)
    t.start()
    try:
        push.url = f"http://127.0.0.1:{httpd.server_port}/poison"
        assert push.send({"checks": []}) == {"queued": 0}
    finally:
        t.join(5)
        httpd.server_close()
    ((header, body),) = seen
    assert json.loads(body) == {"checks": []}
    assert auth.AdminVerifier(cred.key).check(header, "POST", "/poison", body) is None
