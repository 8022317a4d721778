"""A recorded pid that now belongs to someone else is never signalled, by stop, status or the supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from belugactl.workflows.serve.control import read_state, status, stop
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.proc_identity import (
    ProcessIdentity,
    is_running,
    signal_group,
    signal_process,
    terminate,
)
from belugactl.workflows.serve.supervisor import Managed, Supervisor

pytestmark = pytest.mark.process  # every test here starts a process


@pytest.fixture
def bystander():
    """An unrelated process in its own session (so it leads a process group, like serve's children)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # noqa: S607
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _forged(proc: subprocess.Popen, *, start_offset: float = -3600.0) -> dict:
    """The bystander's pid and command line, but the start time of an older process that had the pid."""
    real = ProcessIdentity.of(proc.pid)
    assert real is not None and real.start_ticks is not None
    ticks = max(0, real.start_ticks + round(start_offset * os.sysconf("SC_CLK_TCK")))
    return {**real.to_dict(), "start_time": real.start_time + start_offset, "start_ticks": ticks}


def _state(tmp_path: Path, proc: subprocess.Popen, *, supervisor: dict | None, entry: dict | None) -> None:
    doc = {
        "supervisor_pid": supervisor["pid"] if supervisor else None,
        "supervisor": supervisor,
        "state": "ready",
        "processes": [
            {"name": "vllm-0", "kind": "vllm", "pid": proc.pid, "identity": entry, "port": None, "health_url": None,
             "status": "ready", "restarts": 0},
        ],
    }  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(doc))


def _still_sleeping(proc: subprocess.Popen) -> bool:
    time.sleep(0.3)
    return proc.poll() is None


def test_identity_matches_only_the_same_process(bystander):
    real = ProcessIdentity.of(bystander.pid)
    assert real is not None and real.cmdline == ("sleep", "60")
    assert is_running(real)
    assert not is_running(ProcessIdentity.from_dict(_forged(bystander)))
    assert not is_running(ProcessIdentity.from_dict(_forged(bystander, start_offset=0.5)))
    # a renamed process (setproctitle) is still itself when its executable is
    renamed = ProcessIdentity(real.pid, real.start_time, ("VLLM::EngineCore",), real.exe)
    assert renamed.matches(real)
    assert not ProcessIdentity(real.pid, real.start_time, ("other",), "/bin/other").matches(real)


def test_a_stepped_wall_clock_does_not_make_a_live_process_look_gone(bystander):
    """psutil's create_time is boot time + ticks, and the kernel's boot time moves when NTP steps the
    clock: a later reader can see one process's create_time a second off. The ticks decide."""
    real = ProcessIdentity.of(bystander.pid)
    assert real is not None and real.start_ticks is not None and real.boot_id
    stepped = ProcessIdentity.from_dict({**real.to_dict(), "start_time": real.start_time - 1.0})
    assert stepped is not None and stepped.start_ticks == real.start_ticks
    assert is_running(stepped)
    # one tick later is another process, whatever the wall clock says
    other = ProcessIdentity.from_dict({**real.to_dict(), "start_ticks": real.start_ticks + 1})
    assert not is_running(other)
    # ticks of another boot do not compare: the wall-clock time decides, tightly
    old_boot = {**real.to_dict(), "boot_id": "another-boot", "start_time": real.start_time - 1.0}
    assert not is_running(ProcessIdentity.from_dict(old_boot))
    # a state file from before ticks were recorded still works on the wall-clock time
    legacy = {k: v for k, v in real.to_dict().items() if k not in ("start_ticks", "boot_id")}
    assert is_running(ProcessIdentity.from_dict(legacy))
    assert not is_running(ProcessIdentity.from_dict({**legacy, "start_time": real.start_time - 1.0}))


def test_signals_never_reach_a_reused_pid(bystander):
    forged = ProcessIdentity.from_dict(_forged(bystander))
    assert not signal_process(forged, signal.SIGTERM)
    assert not signal_group(forged, signal.SIGTERM)
    assert not terminate(forged, grace_s=0.1)
    assert _still_sleeping(bystander)


def test_stop_does_not_signal_a_forged_supervisor_or_child(tmp_path, bystander):
    forged = _forged(bystander)
    _state(tmp_path, bystander, supervisor=forged, entry=forged)
    result = stop(tmp_path, timeout_s=2)
    assert result["stopped"] == [] and result["nothing_running"] is True
    assert _still_sleeping(bystander)
    # ... and the state file no longer lists the pid as live, so a later stop cannot find it either
    after = read_state(tmp_path)
    assert after["state"] == "stopped" and after["supervisor_pid"] is None
    assert after["processes"][0]["pid"] is None and after["processes"][0]["last_pid"] == bystander.pid
    assert stop(tmp_path)["stopped"] == []
    assert _still_sleeping(bystander)


def test_status_reports_a_reused_pid_as_not_alive(tmp_path, bystander):
    forged = _forged(bystander)
    _state(tmp_path, bystander, supervisor=forged, entry=forged)
    doc = status(tmp_path)
    assert doc["state"] == "supervisor gone"
    assert doc["processes"][0]["alive"] is False
    assert _still_sleeping(bystander)


def test_an_older_state_file_without_identities_is_never_signalled(tmp_path, bystander):
    _state(tmp_path, bystander, supervisor=None, entry=None)
    state = read_state(tmp_path)
    state["supervisor_pid"] = bystander.pid
    (tmp_path / "state.json").write_text(json.dumps(state))
    result = stop(tmp_path, timeout_s=2)
    assert result["stopped"] == []
    assert any(str(bystander.pid) in entry for entry in result["skipped"])
    assert _still_sleeping(bystander)
    assert read_state(tmp_path)["processes"][0]["pid"] == bystander.pid  # kept for the operator


def test_the_supervisor_does_not_signal_a_reused_pid(tmp_path, bystander):
    spec = ProcessSpec(name="vllm-0", kind="vllm", argv=("sleep", "60"), env={}, log_file=str(tmp_path / "l.log"))
    sup = Supervisor(ServePlan("rack", "host", "rack.yaml", str(tmp_path), "pool", [spec]), say=lambda _: None)
    # Its child exited and was reaped long ago; the number now belongs to the bystander.
    gone = subprocess.Popen(["true"])  # noqa: S607
    gone.wait()
    managed: Managed = sup.procs[0]
    managed.proc, managed.status = gone, "ready"
    managed.identity = ProcessIdentity.from_dict({**_forged(bystander), "pid": bystander.pid})
    # the Popen's pid is irrelevant: the supervisor signals through the recorded identity
    sup.stop_grace_s = 0.2
    sup.stop()
    assert _still_sleeping(bystander)
    assert read_state(tmp_path)["processes"][0]["pid"] is None


def test_a_real_child_is_still_stopped(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    identity = ProcessIdentity.of(child.pid)
    assert terminate(identity, grace_s=5)
    assert child.wait(timeout=10) == -signal.SIGTERM
