"""Per instance: did its connector reach the metadata server, hits, saves, load errors; unknown stays unknown."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.workflows.serve.connector_report import describe, summarize, wait_for_connectors
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.supervisor import Supervisor
from tests.support import FAKE_SERVICE

FAKE = str(FAKE_SERVICE)


def _doc(role: str, *, healthy: bool = True, **counters: int) -> dict:
    return {"role": role, "healthy": healthy, "counters": counters}


def _write(prefix: Path, *docs: dict) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (prefix.parent / f"{prefix.name}.{doc['role']}.json").write_text(json.dumps(doc))


def test_connected_when_scheduler_and_every_worker_reached_the_server():
    roles = {
        "scheduler": _doc("scheduler", connects=1, hit_blocks=12),
        "worker0": _doc("worker0", connects=1, saved_blocks=30, load_errors=1),
        "worker1": _doc("worker1", connects=2, saved_blocks=10),
    }
    entry = summarize(roles)
    assert entry["connected"] is True and entry["why"] is None
    assert (entry["hits"], entry["saves"], entry["load_errors"]) == (12, 40, 1)
    assert describe(entry) == "connected, hits 12, saves 40, load errors 1"


def test_a_worker_that_cannot_reach_the_tcp_listener_means_not_connected():
    # the misconfigured rack: lookups over the ring work, saves over TCP never do
    roles = {
        "scheduler": _doc("scheduler", connects=1),
        "worker0": _doc("worker0", healthy=False, server_unavailable=3),
    }
    entry = summarize(roles)
    assert entry["connected"] is False and "worker0" in entry["why"]
    assert entry["saves"] == 0 and entry["server_unavailable"] == 3


def test_nothing_reported_is_unknown_not_zero():
    entry = summarize({})
    assert entry["connected"] is None
    assert entry["hits"] is None and entry["saves"] is None and entry["load_errors"] is None
    assert describe(entry) == "connection unknown, hits unknown, saves unknown, load errors unknown"
    only_scheduler = summarize({"scheduler": _doc("scheduler", connects=1, hit_blocks=2)})
    assert only_scheduler["connected"] is None and "worker" in only_scheduler["why"]
    assert only_scheduler["hits"] == 2 and only_scheduler["saves"] is None
    not_tried = summarize({"scheduler": _doc("scheduler"), "worker0": _doc("worker0")})
    assert not_tried["connected"] is None


def test_wait_returns_as_soon_as_every_instance_has_an_answer(tmp_path):
    a, b = tmp_path / "stats" / "vllm-0", tmp_path / "stats" / "vllm-1"
    _write(a, _doc("scheduler", connects=1), _doc("worker0", connects=1))
    _write(b, _doc("scheduler", connects=1), _doc("worker0", healthy=False))
    report = wait_for_connectors({"vllm-0": str(a), "vllm-1": str(b)}, timeout_s=5)
    assert report["vllm-0"]["connected"] is True and report["vllm-1"]["connected"] is False
    # no files at all: gives up at the timeout and says unknown
    nothing = wait_for_connectors({"vllm-2": str(tmp_path / "none")}, timeout_s=0.2, poll_s=0.05)
    assert nothing["vllm-2"]["connected"] is None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_after_start_serve_says_which_instance_is_not_connected_and_status_shows_it(tmp_path, capsys):
    specs = []
    for i in range(2):
        port = _port()
        specs.append(ProcessSpec(
            name=f"vllm-{i}", kind="vllm", argv=(sys.executable, FAKE, str(port), "ok"), env={},
            log_file=str(tmp_path / "logs" / f"vllm-{i}.log"), port=port,
            health_url=f"http://127.0.0.1:{port}/health", stats_prefix=str(tmp_path / "stats" / f"vllm-{i}"),
        ))  # fmt: skip
    _write(Path(specs[0].stats_prefix), _doc("scheduler", connects=1, hit_blocks=5),
           _doc("worker0", connects=1, saved_blocks=7))  # fmt: skip
    _write(Path(specs[1].stats_prefix), _doc("scheduler", connects=1), _doc("worker0", healthy=False))
    said: list[str] = []
    sup = Supervisor(ServePlan("rack", "host", "rack.yaml", str(tmp_path), "pool", specs), say=said.append,
                     poll_s=0.05, connector_timeout_s=2)  # fmt: skip
    sup.start()
    try:
        warnings = [s for s in said if "WARNING" in s]
        assert len(warnings) == 1 and "vllm-1's KV connector did not reach the metadata server" in warnings[0]
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["connectors"]["vllm-1"]["connected"] is False
        assert run(["status", "--run-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        line0 = next(x for x in out.splitlines() if "vllm-0" in x)
        line1 = next(x for x in out.splitlines() if "vllm-1" in x)
        assert "pool: connected, hits 5, saves 7, load errors 0" in line0
        assert "pool: NOT connected, hits 0, saves 0, load errors 0" in line1
        assert run(["status", "--run-dir", str(tmp_path), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [p["cache"]["connected"] for p in doc["processes"]] == [True, False]
    finally:
        sup.stop()
