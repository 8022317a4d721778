"""Issue 30's local findings for serve: vLLM's listen address, the run dir, and whom `stop` signals."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from belugactl.cli.app import run as run_cli
from belugactl.errors import InputError
from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve import run_dir
from belugactl.workflows.serve.control import prepare, status, stop
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan, Tools, build_serve_plan
from belugactl.workflows.serve.preflight import exposure_warnings
from belugactl.workflows.serve.proc_identity import ProcessIdentity, is_running
from belugactl.workflows.serve.router import add_router
from belugactl.workflows.serve.run_dir import prepare_run_dir
from belugactl.workflows.serve.supervisor import Supervisor
from tests.support.small_rack import SMALL_RACK

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl=None)
RACK = REPO / "examples" / "beluga-rack.yaml"
NOBODY_UID = 65534


def _vllm(manifest: Path, host: str):
    rack = load_rack_context(manifest, host=host, pool="/dev/dax0.0")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    return [p for p in plan.processes if p.kind == "vllm"]


def _host_arg(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--host"]


# ---- vLLM's listen address (item 6) ---------------------------------------------------------------


def _rack_with(tmp_path: Path, old: str = "", new: str = "", *, base: str = SMALL_RACK) -> Path:
    assert old in base
    path = tmp_path / "rack.yaml"
    path.write_text(base.replace(old, new, 1) if old else base)
    return path


def test_vllm_listens_on_loopback_by_default(tmp_path: Path) -> None:
    path = _rack_with(tmp_path)
    procs = _vllm(path, "h1")
    assert procs and all(_host_arg(p.argv) == ["127.0.0.1"] for p in procs)
    assert all(p.health_url.startswith("http://127.0.0.1:") for p in procs)  # type: ignore[union-attr]
    assert exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0")) == []


def test_with_a_router_vllm_listens_where_the_router_dials_it_and_serve_warns(tmp_path: Path) -> None:
    path = _rack_with(tmp_path, "serve:\n", "serve:\n  router: {bind: 127.0.0.1}\n")
    procs = _vllm(path, "h1")
    assert procs and all(_host_arg(p.argv) == ["10.0.0.2"] for p in procs)
    assert all(p.health_url.startswith("http://10.0.0.2:") for p in procs)  # type: ignore[union-attr]
    warnings = exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0"))
    assert warnings == [
        "WARNING: vLLM listens on 10.0.0.2 (hosts[].address of h1 (serve.router)), beyond loopback: anyone who "
        "reaches it can use the model's API without a credential; firewall it to the router's hosts"
    ]


def test_an_operators_host_in_extra_args_is_kept_and_every_address_is_warned_about(tmp_path: Path) -> None:
    path = _rack_with(
        tmp_path, "    instances_per_host: 2\n", "    instances_per_host: 2\n    extra_args: [--host=0.0.0.0]\n"
    )
    procs = _vllm(path, "h1")
    assert procs and all("--host" not in p.argv and "--host=0.0.0.0" in p.argv for p in procs)
    warnings = exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0"))
    assert len(warnings) == 1 and "vLLM listens on every address (serve.vllm.extra_args --host)" in warnings[0]


def test_the_cpu_demo_serves_on_loopback_without_a_warning(tmp_path: Path) -> None:
    rack = load_rack_context(REPO / "examples" / "cpu-demo.yaml", pool=str(tmp_path / "p.pool"))
    plan = prepare(rack, run_dir=str(tmp_path / "run"), vllm="/opt/vllm/bin/vllm", check=False).plan
    assert not any("WARNING" in n for n in plan.notes), plan.notes
    vllm = [p for p in plan.processes if p.kind == "vllm"]
    assert vllm and all(_host_arg(p.argv) == [] and "--host=127.0.0.1" in p.argv for p in vllm)


def test_a_dry_run_shows_the_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "examples" / "cpu-demo.yaml").read_text().replace("--host=127.0.0.1", "--host=0.0.0.0")
    path = tmp_path / "demo.yaml"
    path.write_text(text.replace("model: ./", f"model: {REPO / 'examples'}/"))
    assert run_cli(["serve", "-f", str(path), "--pool", str(tmp_path / "p.pool"), "--dry-run"]) in (0, None)
    assert "# note: WARNING: vLLM listens on every address" in capsys.readouterr().out


def test_a_metadata_listener_beyond_loopback_is_warned_about() -> None:
    rack = load_rack_context(RACK, host="beluga-00", pool="/dev/dax0.0")
    assert any("rpc_bind is 10.10.0.11, beyond loopback" in w for w in exposure_warnings(rack))


# ---- the run dir serve writes (item 2) -------------------------------------------------------------


def _as_another_user(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` another user's from this process's point of view (root: chown it; others: pretend
    to be a user who is neither its owner nor root)."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY_UID, -1)
    else:
        monkeypatch.setattr(run_dir.os, "geteuid", lambda: 4242)


def test_a_new_run_dir_is_private(tmp_path: Path) -> None:
    run = prepare_run_dir(tmp_path / "a" / "run")
    for d in (run, run / "logs", run / "stats"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700 and os.lstat(d).st_uid == os.geteuid()


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "symlink", "another user", "open parent"])
def test_a_run_dir_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    parent = tmp_path / "p"
    run = parent / "run"
    run.mkdir(parents=True, mode=0o700)
    if how == "group-writable":
        os.chmod(run, 0o770)
    elif how == "world-writable":
        os.chmod(run, 0o777)
    elif how == "symlink":
        os.rename(run, parent / "elsewhere")
        run.symlink_to(parent / "elsewhere")
    elif how == "another user":
        _as_another_user(run, monkeypatch)
    else:
        os.chmod(parent, 0o777)  # not sticky: anyone could rename run away and put theirs there
    with pytest.raises(InputError):
        prepare_run_dir(run)
    pool = tmp_path / "demo.pool"
    argv = ["serve", "-f", str(REPO / "examples" / "cpu-demo.yaml"), "--pool", str(pool), "--run-dir", str(run)]
    assert run_cli([*argv, "--create-pool"]) == 2
    err = capsys.readouterr().err
    assert f"run dir {run}" in err and "Traceback" not in err
    assert not (run / "state.json").exists() and not (parent / "elsewhere" / "state.json").exists()


def test_serve_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    run = prepare_run_dir(tmp_path / "run")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / ".state.json.tmp").symlink_to(victim)  # the temporary name serve used before
    (run / f".state.json.{os.getpid()}.tmp").symlink_to(victim)
    (run / "logs" / "vllm-0.log").symlink_to(victim)
    spec = ProcessSpec(name="vllm-0", kind="vllm", argv=("true",), env={}, log_file=str(run / "logs" / "vllm-0.log"))
    sup = Supervisor(ServePlan("rack", "host", "rack.yaml", str(run), "pool", [spec]), say=lambda _: None)
    sup.write_state()
    assert json.loads((run / "state.json").read_text())["state"] == "starting"
    with pytest.raises(InputError, match="cannot open the log"):
        sup.start()  # refused before anything is started
    assert sup.procs[0].proc is None
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(os.stat(run / "state.json").st_mode) == 0o600


# ---- whom stop signals (item 1) ------------------------------------------------------------------


@pytest.fixture
def bystander():
    """An unrelated process in its own session (it leads a process group, like serve's children)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # noqa: S607
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _copied_state(run: Path, proc: subprocess.Popen, *, as_supervisor: bool) -> Path:
    """A state file whose identity of `proc` was copied from /proc, exactly."""
    copied = ProcessIdentity.of(proc.pid)
    assert copied is not None and is_running(copied)
    log = run / "logs" / "vllm-0.log"
    log.write_text("")
    doc = {
        "supervisor_pid": proc.pid if as_supervisor else None,
        "supervisor": copied.to_dict() if as_supervisor else None,
        "state": "ready",
        "processes": [
            {"name": "vllm-0", "kind": "vllm", "pid": proc.pid, "identity": copied.to_dict(), "log_file": str(log),
             "port": None, "health_url": None, "status": "ready", "restarts": 0},
        ],
    }  # fmt: skip
    path = run / "state.json"
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    return path


def _alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.2)  # a SIGTERM sent would have landed by now
    return proc.poll() is None


@pytest.mark.process
@pytest.mark.parametrize("as_supervisor", [False, True])
def test_stop_refuses_an_identity_copied_from_proc(
    tmp_path: Path, bystander: subprocess.Popen, capsys: pytest.CaptureFixture[str], as_supervisor: bool
) -> None:
    run = prepare_run_dir(tmp_path / "run")
    _copied_state(run, bystander, as_supervisor=as_supervisor)
    with pytest.raises(InputError, match="refusing to signal anything") as info:
        stop(run, timeout_s=1)
    assert f"pid {bystander.pid}" in (info.value.why or "")
    assert run_cli(["stop", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "serve did not start" in err and "Traceback" not in err
    assert _alive(bystander)


@pytest.mark.process
@pytest.mark.parametrize("how", ["group-writable", "another user", "symlink"])
def test_stop_refuses_a_state_file_others_could_write(
    tmp_path: Path, bystander: subprocess.Popen, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run = prepare_run_dir(tmp_path / "run")
    path = _copied_state(run, bystander, as_supervisor=False)
    if how == "group-writable":
        os.chmod(path, 0o620)
    elif how == "another user":
        _as_another_user(path, monkeypatch)
    else:
        os.rename(path, tmp_path / "planted.json")
        path.symlink_to(tmp_path / "planted.json")
    with pytest.raises(InputError, match=f"state file {path} is"):
        stop(run, timeout_s=1)
    with pytest.raises(InputError, match="state file"):
        status(run)
    assert _alive(bystander)


def test_a_router_beyond_loopback_is_warned_about_where_it_runs(tmp_path: Path) -> None:
    path = _rack_with(tmp_path, "serve:\n", "serve:\n  router: {bind: 0.0.0.0, hosts: [h0]}\n")
    for host, said in (("h0", True), ("h1", False)):
        rack = load_rack_context(path, host=host, pool="/dev/dax0.0")
        plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
        add_router(plan, rack.manifest, haproxy="/usr/sbin/haproxy")
        warned = any("the router binds 0.0.0.0" in w for w in exposure_warnings(rack, plan))
        assert warned is said


def test_directories_serve_creates_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        run = prepare_run_dir(tmp_path / "state" / "belugactl" / "serve")
    finally:
        os.umask(old)
    for d in (tmp_path / "state", tmp_path / "state" / "belugactl", run):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700


@pytest.mark.process
def test_stop_still_stops_a_child_that_holds_its_log_on_another_fd(tmp_path: Path) -> None:
    """A library may point fd 1 at /dev/null for a while (vLLM does, keeping a dup): still serve's."""
    run = prepare_run_dir(tmp_path / "run")
    log = run / "logs" / "vllm-0.log"
    code = "import os,time; k=os.dup(1); n=os.open(os.devnull, os.O_WRONLY); os.dup2(n,1); os.dup2(n,2); time.sleep(60)"
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while run_dir.holds_file(child.pid, log, fds=(1,)) and time.monotonic() < deadline:
            time.sleep(0.02)  # until it has moved fd 1 away
        _copied_state(run, child, as_supervisor=False)  # names this log, which the child holds on fd 3
        assert stop(run, timeout_s=1)["stopped"] == ["vllm-0"]
        assert child.wait(timeout=10) is not None
    finally:
        child.kill()
        child.wait(timeout=10)
