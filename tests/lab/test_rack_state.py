"""Lab bookkeeping without QEMU: state directories, pid checks, crash detection, and `down`."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from belugactl.errors import UsageError
from belugactl.lab import emulated_rack, proc
from belugactl.lab.paths import STATE_ENV, LabPaths


@pytest.fixture
def state(tmp_path, monkeypatch):
    root = tmp_path / "state" / "lab"
    monkeypatch.setenv(STATE_ENV, str(root))
    return root


def _fake_lab(root: Path, name: str, guests: list[str]) -> LabPaths:
    paths = LabPaths(root, name)
    record = emulated_rack.LabRecord(name, len(guests), 512 << 20, 1024, "tcg", {"version": "v"}, "i", 0.0, "/r", "/v",
                            [emulated_rack.GuestRecord(g, i + 1) for i, g in enumerate(guests)])
    for g in guests:
        gp = paths.guest(g)
        (gp.spool).mkdir(parents=True)
        gp.console.write_text("[    1.0] booting\nKernel panic - not syncing: test\n")
    paths.pool.write_bytes(b"")
    paths.state_file.write_text(json.dumps(record.to_dict()))
    return paths


def _fake_qemu(guest_dir: Path) -> subprocess.Popen:
    """A process whose command line looks like this guest's QEMU (argv[0] and its console path)."""
    return subprocess.Popen(  # noqa: S603
        ["qemu-system-x86_64", "-c", "trap 'exit 0' TERM; while :; do sleep 0.1; done",
         f"file,id=console,path={guest_dir}/console.log"],
        executable="/bin/sh", start_new_session=True,
    )


def _wait_ready_file(spool: Path) -> None:
    (spool / "ready").write_text('{"hostname": "lab-1"}')
    (spool / "heartbeat").write_text("1\n")


def test_validation_of_up_arguments():
    with pytest.raises(UsageError, match="256 MiB"):
        emulated_rack.validate(2, 100 << 20, 1024)
    with pytest.raises(UsageError, match="hosts"):
        emulated_rack.validate(17, 512 << 20, 1024)
    with pytest.raises(UsageError):
        emulated_rack.lab_paths("../escape")
    emulated_rack.validate(16, 4 << 30, 512)


def test_a_lab_that_does_not_exist_is_down_and_down_is_a_no_op(state):
    assert emulated_rack.status("nolab").state == "down"
    report = emulated_rack.down("nolab")
    assert not report.existed and report.removed is None


@pytest.mark.process
def test_running_guest_then_crash_is_reported(state):
    paths = _fake_lab(state, "t1", ["lab-1"])
    g = paths.guest("lab-1")
    qemu = _fake_qemu(g.dir)
    try:
        g.pidfile.write_text(f"{qemu.pid}\n")
        assert emulated_rack.status("t1").guests[0].state == "booting"
        _wait_ready_file(g.spool)
        st = emulated_rack.status("t1")
        assert st.state == "up" and st.guests[0].state == "running"
        qemu.kill()
        qemu.wait()
        st = emulated_rack.status("t1")
        assert st.state == "degraded"
        assert st.guests[0].state == "crashed"
        assert any("Kernel panic" in line for line in st.guests[0].console_tail)
    finally:
        qemu.kill()
        qemu.wait()


@pytest.mark.process
def test_stale_heartbeat_means_unresponsive(state):
    paths = _fake_lab(state, "t2", ["lab-1"])
    g = paths.guest("lab-1")
    qemu = _fake_qemu(g.dir)
    try:
        g.pidfile.write_text(f"{qemu.pid}\n")
        _wait_ready_file(g.spool)
        old = time.time() - 3600
        os.utime(g.spool / "heartbeat", (old, old))
        assert emulated_rack.status("t2").guests[0].state == "unresponsive"
    finally:
        qemu.kill()
        qemu.wait()


@pytest.mark.process
def test_down_stops_our_qemu_and_leaves_nothing(state):
    paths = _fake_lab(state, "t3", ["lab-1", "lab-2"])
    procs = [_fake_qemu(paths.guest(n).dir) for n in ("lab-1", "lab-2")]
    for p, n in zip(procs, ("lab-1", "lab-2"), strict=True):
        paths.guest(n).pidfile.write_text(f"{p.pid}\n")
    report = emulated_rack.down("t3")
    assert sorted(report.stopped) == ["lab-1", "lab-2"]
    for p in procs:
        assert p.wait(timeout=10) is not None
    assert not paths.dir.exists()
    assert not state.exists()  # the empty parent folder went too


@pytest.mark.process
def test_down_never_kills_a_pid_that_is_not_this_guests_qemu(state):
    paths = _fake_lab(state, "t4", ["lab-1"])
    stranger = subprocess.Popen(["sleep", "30"])  # noqa: S603, S607 - the pid file now points at someone else
    try:
        paths.guest("lab-1").pidfile.write_text(f"{stranger.pid}\n")
        st = emulated_rack.status("t4")
        assert st.guests[0].state == "crashed" and "another program" in st.guests[0].detail
        report = emulated_rack.down("t4")
        assert report.refused and not report.stopped
        assert stranger.poll() is None  # still alive
        assert not paths.dir.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_up_refuses_a_lab_that_already_exists(state, monkeypatch):
    _fake_lab(state, "t5", ["lab-1"])
    monkeypatch.setattr(emulated_rack.prereqs, "require", lambda: None)
    with pytest.raises(UsageError, match="already exists"):
        emulated_rack.up(name="t5", hosts=1, profile="pmem")


def test_exec_into_a_crashed_guest_is_an_environment_problem(state):
    paths = _fake_lab(state, "t6", ["lab-1"])
    paths.guest("lab-1").pidfile.write_text("999999999\n")
    from belugactl.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="crashed"):
        emulated_rack.channel("t6", "lab-1")
    with pytest.raises(UsageError, match="no host"):
        emulated_rack.channel("t6", "lab-7")


@pytest.mark.process
def test_alive_treats_zombies_as_dead():
    child = subprocess.Popen(["true"])  # noqa: S603, S607
    deadline = time.monotonic() + 10
    while not proc.is_zombie(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not proc.alive(child.pid)  # and alive() reaped it
    assert proc.cmdline(child.pid) is None
    child.returncode = 0
