"""The guest agent's resident CLI (belugactl.lab.guest.resident_cli), with the real agent and the real
resident CLI running on this machine instead of in a guest."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import belugactl
from belugactl.lab.channel import GuestChannel
from belugactl.lab.guest import agent as agent_mod

pytestmark = pytest.mark.process  # every test here starts a process

VENV_BIN = Path(sys.executable).parent
ROOT = str(Path(belugactl.__file__).resolve().parent.parent)


def _installed_root() -> str | None:
    # The resident CLI imports the venv's own belugactl (no PYTHONPATH), as the guest does.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import belugactl, os; print(os.path.dirname(os.path.dirname("
                        "os.path.realpath(belugactl.__file__))))"], capture_output=True, text=True, env=env,
                       cwd="/", check=False)
    return r.stdout.strip() if r.returncode == 0 else None


@pytest.fixture
def resident_channel():
    if not (VENV_BIN / "belugactl").exists() or _installed_root() != ROOT:
        pytest.skip("this checkout is not the venv's installed belugactl")
    short = Path(tempfile.mkdtemp(prefix="bw", dir="/tmp"))  # a unix socket path must stay short
    spool = short / "spool"
    spool.mkdir()
    sock = short / "resident.sock"
    env = {"PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "TMPDIR": "/tmp"}
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-I", "-S", agent_mod.__file__, "--spool", str(spool), "--hostname", "lab-1",
         "--resident-python", str(VENV_BIN / "python"), "--resident-socket", str(sock)],
        start_new_session=True, env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{sock}.json").exists():
            assert proc.poll() is None, "agent exited"
            assert time.monotonic() < deadline, f"the resident CLI never became ready: {spool / 'resident-cli.log'}"
            time.sleep(0.05)
        yield GuestChannel(spool, name="lab-1", alive=lambda: proc.poll() is None)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(json.loads(Path(f"{sock}.json").read_text())["pid"], 9)  # its own session
        shutil.rmtree(short, ignore_errors=True)


def test_belugactl_runs_in_the_resident_cli_with_the_same_output_and_exit_code_as_spawned(resident_channel, tmp_path):
    resident = resident_channel.run(["belugactl", "--version"], timeout=60)
    cold = resident_channel.run(["/bin/sh", "-c", 'exec "$0" --version', str(VENV_BIN / "belugactl")], timeout=60)
    assert resident.resident and not cold.resident
    assert (resident.returncode, resident.stdout, resident.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert resident.stdout.startswith(b"belugactl ")
    # A usage error and a bad manifest: exit 2, error text on stderr, the same as the script gives.
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: [\n")
    for args in (["doctor", "--no-such-flag"], ["manifest", "check", "-f", str(bad)]):
        w = resident_channel.run(["belugactl", *args], timeout=60)
        c = resident_channel.run(["/bin/sh", "-c", 'exec "$0" "$@"', str(VENV_BIN / "belugactl"), *args], timeout=60)
        assert w.resident and (w.returncode, w.stdout, w.stderr) == (c.returncode, c.stdout, c.stderr)
        assert w.returncode == 2


def test_env_cwd_and_stdin_reach_the_resident_cli_child(resident_channel, tmp_path):
    manifest = Path(ROOT) / "examples" / "lab.yaml"
    shutil.copy(manifest, tmp_path / "rack.yaml")
    # a relative manifest path resolves against the request's cwd; `env K=V` in front is understood
    r = resident_channel.run(["env", f"PYTHONPATH={ROOT}", "belugactl", "manifest", "check", "-f", "rack.yaml",
                          "--json"], timeout=60, cwd=str(tmp_path))
    assert r.resident and r.returncode == 0, r.stderr
    assert b'"name"' in r.stdout
    r = resident_channel.run([str(VENV_BIN / "python"), "-m", "belugactl", "manifest", "check", "-f", "-"],
                         timeout=60, stdin=(tmp_path / "rack.yaml").read_bytes())
    assert r.resident and r.returncode in (0, 2)


def test_another_checkout_or_program_is_spawned_not_resident(resident_channel, tmp_path):
    r = resident_channel.run(["env", f"PYTHONPATH={tmp_path}", "belugactl", "--version"], timeout=60)
    assert not r.resident and r.returncode == 0
    r = resident_channel.run(["sh", "-c", "echo plain"], timeout=60)
    assert not r.resident and r.stdout == b"plain\n"


def test_a_resident_cli_command_that_runs_too_long_is_killed_with_124(resident_channel):
    start = time.monotonic()
    # `metadata-server` runs until stopped; the agent's timeout kills the resident CLI's child's process group.
    r = resident_channel.run(["belugactl", "bench", "soak", "--seconds", "600"], timeout=2)
    assert r.resident and r.returncode == 124 and r.timed_out
    assert time.monotonic() - start < 20


def test_concurrent_resident_cli_commands_do_not_mix(resident_channel, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[int, bytes]:
        r = resident_channel.run(["belugactl", "manifest", "check", "-f", str(tmp_path / f"m{i}.yaml")], timeout=60)
        return r.returncode, r.stderr

    for i in range(4):
        (tmp_path / f"m{i}.yaml").write_text(f"version: 1\nname: m{i}\nbogus_{i}: 1\n")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    for i, (rc, err) in enumerate(results):
        assert rc == 2 and f"bogus_{i}".encode() in err and all(f"bogus_{j}".encode() not in err
                                                                 for j in range(4) if j != i)
