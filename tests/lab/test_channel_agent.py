"""The exec channel end to end, with the real agent running on this machine instead of in a guest."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from belugactl.lab.channel import GuestChannel, GuestRunner, GuestUnavailable
from belugactl.lab.guest import agent as agent_mod


@pytest.fixture
def channel(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-I", "-S", agent_mod.__file__, "--spool", str(spool), "--hostname", "lab-1"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (spool / "ready").exists():
            assert proc.poll() is None, "agent exited"
            assert time.monotonic() < deadline, "agent never became ready"
            time.sleep(0.02)
        yield GuestChannel(spool, name="lab-1", alive=lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.process
def test_output_and_exit_status_come_back(channel):
    r = channel.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=20)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (7, b"out\n", b"err\n", False)


@pytest.mark.process
def test_output_streams_to_given_sinks(channel):
    out, err = io.BytesIO(), io.BytesIO()
    r = channel.run(["sh", "-c", "printf a; sleep 0.3; printf b; printf e >&2"], timeout=20, stdout=out, stderr=err)
    assert r.returncode == 0 and out.getvalue() == b"ab" and err.getvalue() == b"e"
    assert r.stdout == b""  # streamed, not kept


@pytest.mark.process
def test_environment_cwd_and_stdin_reach_the_command(channel, tmp_path):
    r = channel.run(["sh", "-c", 'pwd; echo "$LABVAR"; cat'], timeout=20, cwd=str(tmp_path),
                    env={"LABVAR": "v1"}, stdin=b"from stdin")
    assert r.stdout.decode().splitlines() == [str(tmp_path), "v1", "from stdin"]


@pytest.mark.process
def test_timeout_kills_the_command_and_reports_124(channel, tmp_path):
    finished = tmp_path / "finished"
    r = channel.run(["sh", "-c", f"sleep 30; touch {finished}"], timeout=0.5)
    assert r.returncode == 124 and r.timed_out
    assert not finished.exists()  # killed at its timeout, not waited for to the end


@pytest.mark.process
def test_missing_program_reports_127(channel):
    r = channel.run(["/nonexistent/program"], timeout=20)
    assert r.returncode == 127 and b"cannot run" in r.stderr


@pytest.mark.process
def test_signal_death_reports_128_plus_signal(channel):
    assert channel.run(["sh", "-c", "kill -9 $$"], timeout=20).returncode == 137


@pytest.mark.process
def test_finished_requests_leave_nothing_in_the_spool(channel):
    for _ in range(3):
        channel.run(["true"], timeout=20)
    assert os.listdir(channel.spool / "out") == [] and os.listdir(channel.spool / "req") == []


@pytest.mark.process
def test_concurrent_requests_do_not_mix(channel):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: channel.run(["sh", "-c", f"echo {i}; exit {i}"], timeout=20), range(4)))
    assert [(r.returncode, r.stdout) for r in results] == [(i, f"{i}\n".encode()) for i in range(4)]


@pytest.mark.process
def test_runner_adapter_returns_command_results(channel):
    result = GuestRunner(channel).run(["cat"], input="hello", timeout=20)
    assert result.ok and result.stdout == "hello" and result.argv == ("cat",)


@pytest.mark.process
def test_ready_file_says_who_the_agent_is(channel):
    info = json.loads((channel.spool / "ready").read_text())
    assert info["expected_hostname"] == "lab-1" and info["agent_pid"] > 0


def test_a_dead_guest_is_reported_not_waited_for(tmp_path):
    spool = tmp_path / "spool"
    for d in ("req", "out", "cancel"):
        (spool / d).mkdir(parents=True)
    (spool / "ready").write_text("{}")
    asked: list[bool] = []
    dead = GuestChannel(spool, name="lab-9", alive=lambda: asked.append(False) or False)
    with pytest.raises(GuestUnavailable, match="stopped"):
        dead.run(["true"], timeout=30)
    assert asked == [False]  # the first "not alive" ended the wait: nothing waited for the timeout
    assert os.listdir(spool / "req") == []  # the unclaimed request was withdrawn


def test_a_guest_that_never_booted_is_refused(tmp_path):
    with pytest.raises(GuestUnavailable, match="not ready"):
        GuestChannel(Path(tmp_path), name="lab-1").run(["true"])


@pytest.mark.process
def test_interrupting_the_host_side_kills_the_command_and_cleans_the_spool(channel, tmp_path):
    marker = tmp_path / "still-running"

    class Interrupting(io.BytesIO):
        def write(self, data):  # the first output stands in for the operator's Ctrl-C
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        channel.run(["sh", "-c", f"echo started; sleep 3; touch {marker}"], timeout=60, stdout=Interrupting())
    assert not marker.exists()  # the interrupt came at the first output, not after the command ended
    time.sleep(3.5)  # long enough for a command left running to write its marker
    assert not marker.exists()  # the whole process group was killed
    assert os.listdir(channel.spool / "out") == [] and os.listdir(channel.spool / "cancel") == []
