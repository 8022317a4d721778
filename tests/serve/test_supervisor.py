"""The supervisor with real child processes: readiness, restarts with backoff, giving up, clean stops."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from belugactl.workflows.serve.control import read_state, status, stop
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.supervisor import StartFailed, Supervisor, pid_alive
from tests.support import FAKE_SERVICE

pytestmark = pytest.mark.process  # every test here starts a process

FAKE = str(FAKE_SERVICE)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec(tmp_path: Path, name: str, kind: str, mode: str, *args: str, timeout: float = 20.0) -> ProcessSpec:
    port = _port()
    return ProcessSpec(
        name=name,
        kind=kind,
        argv=(sys.executable, FAKE, str(port), mode, *args),
        env={"BELUGA_TEST_MARK": name},
        log_file=str(tmp_path / "logs" / f"{name}.log"),
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        ready_timeout_s=timeout,
    )


def _plan(tmp_path: Path, *specs: ProcessSpec) -> ServePlan:
    return ServePlan("rack", "host", "rack.yaml", str(tmp_path), "/tmp/pool", list(specs))


def _quiet(text: str) -> None:
    return


def test_start_waits_for_readiness_and_stop_leaves_nothing(tmp_path: Path) -> None:
    server, worker = _spec(tmp_path, "metadata-server", "metadata", "ok"), _spec(tmp_path, "vllm-0", "vllm", "ok")
    plan = _plan(tmp_path, server, worker)
    sup = Supervisor(plan, say=_quiet, poll_s=0.05)
    sup.start()
    try:
        state = read_state(tmp_path)
        assert state is not None and state["state"] == "ready"
        assert [p["status"] for p in state["processes"]] == ["ready", "ready"]
        pids = [p["pid"] for p in state["processes"]]
        assert all(pid_alive(pid) for pid in pids)
        assert "fake service ok" in Path(plan.processes[1].log_file).read_text()
        doc = status(tmp_path)
        assert doc["running"] is True
        assert all(p["healthy"] for p in doc["processes"])
    finally:
        sup.stop()
    assert not any(pid_alive(pid) for pid in pids)
    assert read_state(tmp_path)["state"] == "stopped"
    assert status(tmp_path)["running"] is False


def test_a_process_that_dies_before_ready_fails_the_start_and_stops_the_rest(tmp_path: Path) -> None:
    server = _spec(tmp_path, "metadata-server", "metadata", "ok")
    broken = _spec(tmp_path, "vllm-0", "vllm", "exit-now")
    sup = Supervisor(_plan(tmp_path, server, broken), say=_quiet, poll_s=0.05)
    with pytest.raises(StartFailed, match="vllm-0 exited with status 3 before it was ready") as info:
        sup.start()
    assert "fake service exit-now" in (info.value.why or "")
    state = read_state(tmp_path)
    assert state["state"] == "stopped"
    assert not any(pid_alive(p["pid"]) for p in state["processes"])


def test_a_crash_after_ready_is_restarted_then_given_up_on(tmp_path: Path) -> None:
    flaky = _spec(tmp_path, "vllm-0", "vllm", "crash-after", "0.3")
    steady = _spec(tmp_path, "vllm-1", "vllm", "ok")
    said: list[str] = []
    sup = Supervisor(_plan(tmp_path, flaky, steady), say=said.append, poll_s=0.05, backoff_s=0.1, max_restarts=2)
    sup.start()
    try:
        deadline = time.monotonic() + 30
        while sup.procs[0].status != "failed" and time.monotonic() < deadline:
            sup.step()
            time.sleep(0.05)
        assert sup.procs[0].status == "failed"
        assert sup.procs[0].restarts == 2
        assert any("restarting in 0 s" in s or "restarting in" in s for s in said)
        assert any("giving up on it" in s and "ERROR" in s for s in said)
        # the other instance keeps serving
        assert sup.procs[1].status == "ready" and pid_alive(sup.procs[1].proc.pid)
        assert read_state(tmp_path)["processes"][0]["restarts"] == 2
    finally:
        sup.stop()
    assert not pid_alive(sup.procs[1].proc.pid)


def test_stop_escalates_to_sigkill_for_a_process_ignoring_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from belugactl.workflows.serve import proc_identity, supervisor

    graces: list[float] = []
    sent: list[int] = []
    real_terminate, real_signal_group = supervisor.terminate, proc_identity.signal_group

    def terminate(identity, *, grace_s: float, **kw):  # noqa: ANN001, ANN003, ANN202
        graces.append(grace_s)
        return real_terminate(identity, grace_s=grace_s, **kw)

    def signal_group(identity, sig: int):  # noqa: ANN001, ANN202
        sent.append(sig)
        return real_signal_group(identity, sig)

    monkeypatch.setattr(supervisor, "terminate", terminate)
    monkeypatch.setattr(proc_identity, "signal_group", signal_group)
    stubborn = _spec(tmp_path, "vllm-0", "vllm", "ignore-term")
    sup = Supervisor(_plan(tmp_path, stubborn), say=_quiet, poll_s=0.05, stop_grace_s=0.5)
    sup.start()
    pid = sup.procs[0].proc.pid
    sup.stop()
    assert not pid_alive(pid)
    # It waited only its grace, then killed: SIGTERM, 0.5 s, SIGKILL.
    assert graces == [0.5] and sent == [signal.SIGTERM, signal.SIGKILL]


def test_stop_command_cleans_up_after_a_supervisor_that_is_gone(tmp_path: Path) -> None:
    sup = Supervisor(_plan(tmp_path, _spec(tmp_path, "vllm-0", "vllm", "ok")), say=_quiet, poll_s=0.05)
    sup.start()
    pid = sup.procs[0].proc.pid
    # Pretend the supervisor died without stopping its child (its pid is this test process: make it a
    # pid that does not exist any more).
    state = read_state(tmp_path)
    state["supervisor_pid"] = 2**22 + 12345
    state["supervisor"] = {"pid": 2**22 + 12345, "start_time": 1.0, "cmdline": ["belugactl", "serve"], "exe": None}
    (tmp_path / "state.json").write_text(__import__("json").dumps(state))
    assert status(tmp_path)["state"] == "supervisor gone"
    result = stop(tmp_path)
    assert result["stopped"] == ["vllm-0"]
    assert not pid_alive(pid)
    sup.procs[0].proc.wait(timeout=5)


SUPERVISE = """
import sys
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.supervisor import Supervisor
import json
specs = [ProcessSpec(**d) for d in json.loads(sys.argv[1])]
plan = ServePlan("rack", "host", "rack.yaml", sys.argv[2], "/tmp/pool", specs)
sup = Supervisor(plan, poll_s=0.05)
sup.install_signal_handlers()
sup.start()
print("READY", flush=True)
sys.exit(sup.run())
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_workers_first_then_the_server(tmp_path: Path, signame: str) -> None:
    import json
    import signal
    import subprocess

    server, worker = _spec(tmp_path, "metadata-server", "metadata", "ok"), _spec(tmp_path, "vllm-0", "vllm", "ok")
    specs = [dict(s.to_dict(), argv=list(s.argv), gpus=[]) for s in (server, worker)]
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", SUPERVISE, json.dumps(specs), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    pids = [p["pid"] for p in read_state(tmp_path)["processes"]]
    proc.send_signal(getattr(signal, signame))
    assert proc.wait(timeout=60) == 0
    assert not any(pid_alive(pid) for pid in pids)

    def stopped_at(spec: ProcessSpec) -> float:
        line = next(x for x in Path(spec.log_file).read_text().splitlines() if x.startswith("stopping at"))
        return float(line.split()[-1])

    assert stopped_at(worker) < stopped_at(server)
    assert read_state(tmp_path)["state"] == "stopped"
