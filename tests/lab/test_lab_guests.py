"""The lab for real: QEMU guests with the Debian kernel, the real cxl/ndctl/daxctl, one shared pool.

One 2-guest rack is booted for the whole module and always taken down, whatever happens. Without
the prerequisites these tests fail in CI (CI=true) and are skipped elsewhere, saying why.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

import belugactl
from belugactl.lab import kernel, prereqs
from belugactl.lab.paths import STATE_ENV, cache_root
from tests.support.lab import REPO, our_qemus, run_cli, unavailable

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

LAB = "pytest"


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    missing = prereqs.check()
    if missing:
        unavailable("; ".join(f"{m.reason} (Debian package {m.requirement.package})" for m in missing))
    state = tmp_path_factory.mktemp("labstate")
    env = dict(os.environ, **{STATE_ENV: str(state)})
    if kernel.find(cache_root()) is None:
        prep = run_cli(env, "lab", "prepare", "--profile", "pmem", timeout=900)
        if prep.returncode != 0:
            unavailable(f"`belugactl lab prepare` failed: {prep.stderr.strip()[-500:]}")
    up = None
    try:
        up = run_cli(env, "lab", "up", "--profile", "pmem", "--name", LAB, "--hosts", "2", "--json", timeout=600)
        assert up.returncode == 0, f"lab up failed:\n{up.stderr}"
        yield {"env": env, "state": state, "up": json.loads(up.stdout), "up_stderr": up.stderr}
    finally:
        run_cli(env, "lab", "down", "--name", LAB, timeout=120)
        for pid in our_qemus(state):  # last resort, still only our own QEMU processes
            os.kill(pid, signal.SIGKILL)


def _exec(rack, host: str, *argv: str, timeout: float = 300, opts: tuple[str, ...] = ()):
    return run_cli(rack["env"], "lab", "exec", "--name", LAB, *opts, host, "--", *argv, timeout=timeout + 60)


def test_up_boots_every_guest_and_says_where_things_live(rack):
    doc = rack["up"]
    guests = doc["lab"]["guests"]
    assert [g["name"] for g in guests] == ["lab-1", "lab-2"]
    assert all(g["state"] == "running" and g["boot_s"] > 0 for g in guests)
    assert doc["boot_wall_s"] >= max(g["boot_s"] for g in guests) - 0.5
    assert doc["accel"]["chosen"] == "tcg"
    pool = Path(doc["lab"]["pool"])
    assert pool.is_file() and pool.stat().st_size == 512 * 1024 * 1024
    assert pool.parent.parent == rack["state"]
    assert "ready in" in rack["up_stderr"]


def test_status_json_lists_running_guests_and_the_kernel(rack):
    st = run_cli(rack["env"], "lab", "status", "--name", LAB, "--json")
    assert st.returncode == 0, st.stderr
    doc = json.loads(st.stdout)
    assert doc["state"] == "up" and {g["state"] for g in doc["guests"]} == {"running"}
    assert doc["kernel"]["version"].endswith("-amd64")


def test_exec_returns_output_and_exit_status(rack):
    r = _exec(rack, "lab-1", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")


def test_each_guest_is_named_after_its_manifest_host(rack):
    for host in ("lab-1", "lab-2"):
        r = _exec(rack, host, "hostname")
        assert (r.returncode, r.stdout.strip()) == (0, host)


def test_guests_run_this_checkout_against_their_own_kernel(rack):
    code = "import belugactl, os; print(belugactl.__file__); print(os.uname().release)"
    r = _exec(rack, "lab-1", "python3", "-c", code)
    assert r.returncode == 0, r.stderr
    path, release = r.stdout.split()
    assert Path(path).resolve().parent.parent == REPO
    assert release == rack["up"]["lab"]["kernel"]["version"] != os.uname().release
    r = _exec(rack, "lab-2", "belugactl", "--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"belugactl {belugactl.__version__}")


def test_exec_timeout_kills_the_command(rack):
    finished = "/tmp/exec-timeout-finished"  # in the guest's own tmpfs
    r = _exec(rack, "lab-1", "sh", "-c", f"sleep 120; touch {finished}", opts=("--timeout", "3"))
    assert r.returncode == 124 and "killed after 3 s" in r.stderr
    # Killed at its timeout, not waited for to the end: it never got to write its file.
    assert _exec(rack, "lab-1", "test", "-e", finished).returncode == 1


def test_guest_writes_never_reach_the_host(rack, tmp_path):
    probe = tmp_path / "written-by-guest"
    r = _exec(rack, "lab-1", "sh", "-c", f"echo x > {probe} && cat {probe}")
    assert (r.returncode, r.stdout) == (0, "x\n")
    assert not probe.exists()


def test_selftest_shares_the_pool_through_the_real_tools_and_cleans_up(rack):
    r = run_cli(rack["env"], "lab", "selftest", "--name", LAB, "--json", timeout=600)
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert doc["ok"] and doc["cleaned_up"]
    assert [p["file_offset"] for p in doc["provisioned"]] == [2 * 1024 * 1024] * 2  # map=mem: data at 2 MiB
    assert len(doc["checks"]) == 5 and all(c["ok"] for c in doc["checks"])
    for host in ("lab-1", "lab-2"):
        left = _exec(rack, host, "cxl", "list", "-R")
        assert left.returncode == 0 and json.loads(left.stdout or "[]") == []


def test_discover_runs_in_a_guest(rack):
    r = _exec(rack, "lab-1", "belugactl", "discover", "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert "mem0" in json.dumps(doc)


def test_a_killed_guest_is_reported_crashed_and_down_leaves_nothing(rack):
    env, state = rack["env"], rack["state"]
    doc = json.loads(run_cli(env, "lab", "status", "--name", LAB, "--json").stdout)
    victim = next(g for g in doc["guests"] if g["name"] == "lab-2")
    os.kill(victim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        st = run_cli(env, "lab", "status", "--name", LAB, "--json")
        states = {g["name"]: g["state"] for g in json.loads(st.stdout)["guests"]}
        if states["lab-2"] == "crashed" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st.returncode == 1 and states == {"lab-1": "running", "lab-2": "crashed"}
    refused = _exec(rack, "lab-2", "true")
    assert refused.returncode == 3 and "crashed" in refused.stderr
    down = run_cli(env, "lab", "down", "--name", LAB)
    assert down.returncode == 0, down.stderr
    assert our_qemus(state) == []
    assert list(state.iterdir()) == []
