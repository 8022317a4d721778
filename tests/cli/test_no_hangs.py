"""No hangs, honest exits: reads that could block have a deadline, and the two servers exit 130 on
Ctrl-C (SIGINT) with one line, 0 on SIGTERM (what systemd and serve's supervisor send to stop them).

Real processes, on loopback, each bounded by a subprocess timeout well past the deadline it tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.mds_process import cpu_demo_mds

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"
DEADLINE_ENV = {**os.environ, "BELUGACTL_INPUT_TIMEOUT": "1"}


def _belugactl(*args: str, **kw) -> subprocess.CompletedProcess[str]:  # noqa: ANN003
    return subprocess.run([sys.executable, "-m", "belugactl", *args], capture_output=True, text=True,
                          timeout=30, env=DEADLINE_ENV, cwd=REPO, **kw)  # fmt: skip


def test_manifest_from_a_fifo_nobody_writes_ends_at_the_deadline(tmp_path):
    fifo = tmp_path / "rack.yaml"
    os.mkfifo(fifo)
    done = _belugactl("manifest", "check", "-f", str(fifo))
    assert done.returncode == 2, done.stderr
    assert "no complete manifest arrived within 1 s" in done.stderr and "FIFO" in done.stderr
    assert "BELUGACTL_INPUT_TIMEOUT" in done.stderr and "Traceback" not in done.stderr


def test_manifest_from_a_fifo_that_is_written_and_closed_is_read(tmp_path):
    fifo = tmp_path / "rack.yaml"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:  # blocks until the CLI opens the other end
            f.write(LAB.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    done = _belugactl("manifest", "check", "-f", str(fifo))
    writer.join(timeout=30)
    assert done.returncode == 0, done.stderr


def test_manifest_from_a_stdin_that_never_closes_ends_at_the_deadline():
    proc = subprocess.Popen([sys.executable, "-m", "belugactl", "manifest", "check", "-f", "/dev/stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=DEADLINE_ENV, cwd=REPO)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(b"name: half-a-manifest\n")
    proc.stdin.flush()
    try:
        code = proc.wait(timeout=30)  # stdin stays open: communicate() would close it
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdin.close()
    assert code == 2, err
    assert "no complete manifest arrived within 1 s" in err and "22 bytes read" in err


def test_pool_inspect_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "pool"
    os.mkfifo(fifo)
    done = _belugactl("pool", "inspect", str(fifo))
    assert done.returncode == 2, done.stderr
    assert "is a FIFO, not a pool" in done.stderr and "Traceback" not in done.stderr


def _one_interrupted_line(err: str, who: str) -> str:
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"interrupted: belugactl {who}; ") and "Traceback" not in err
    return lines[0]


@pytest.mark.native
def test_metadata_server_exits_130_on_sigint_and_says_what_it_left(tmp_path):
    with cpu_demo_mds(tmp_path) as m:
        m.proc.send_signal(signal.SIGINT)
        err = m.stderr()
        assert m.proc.returncode == 130, err
    line = _one_interrupted_line(err, "metadata-server")
    assert "stopped cleanly" in line and "the index is gone" in line


@pytest.mark.native
def test_metadata_server_exits_0_on_sigterm(tmp_path):
    with cpu_demo_mds(tmp_path) as m:
        m.proc.send_signal(signal.SIGTERM)
        err = m.stderr()
        assert m.proc.returncode == 0, err
    assert "interrupted" not in err and "metadata server: stopped" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_pd_proxy_exits_130_on_sigint_and_0_on_sigterm(sig, code):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "belugactl", "pd-proxy", "--prefill", "http://127.0.0.1:9",
                             "--decode", "http://127.0.0.1:9", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("pd-proxy on ")  # printed once it listens
        proc.send_signal(sig)
        returncode = proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert returncode == code, err
    if sig == signal.SIGINT:
        assert f"stopped listening on 127.0.0.1:{port}" in _one_interrupted_line(err, "pd-proxy")
    else:
        assert "interrupted" not in err
