"""`lab restart HOST` without QEMU: which guests it boots again, with which files, and what it forgets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem, UsageError
from belugactl.lab import emulated_rack
from belugactl.lab import kernel as kernel_mod
from belugactl.lab.paths import STATE_ENV, LabPaths


@pytest.fixture
def state(tmp_path, monkeypatch):
    root = tmp_path / "state" / "lab"
    monkeypatch.setenv(STATE_ENV, str(root))
    return root


@pytest.fixture
def kernel(tmp_path, monkeypatch) -> kernel_mod.GuestKernel:
    """A cached kernel as `lab up` left it (only the paths the QEMU command line names)."""
    k = kernel_mod.GuestKernel("6.1.0-test-amd64", "linux-image-6.1.0-test-amd64", tmp_path / "kernel")
    monkeypatch.setattr(kernel_mod, "cached", lambda cache: [k])
    monkeypatch.setattr(kernel_mod, "boot_image", lambda kern: kern.root / "vmlinux")
    return k


def _lab(root: Path, name: str, initramfs: Path, *, ssh_port: int | None = None) -> LabPaths:
    paths = LabPaths(root, name)
    guests = [emulated_rack.GuestRecord("lab-1", 1, pid=999999999, ssh_port=ssh_port),
              emulated_rack.GuestRecord("lab-2", 2)]
    record = emulated_rack.LabRecord(name, 2, 512 << 20, 768, "tcg", {"version": "6.1.0-test-amd64"}, str(initramfs),
                                     0.0, "/repo", "/venv", guests)
    for g in ("lab-1", "lab-2"):
        gp = paths.guest(g)
        for sub in ("req", "out", "cancel", "share"):
            (gp.spool / sub).mkdir(parents=True)
        gp.lsa.write_bytes(b"labels")
        gp.console.write_text("old boot\n")
        gp.pidfile.write_text("999999999\n")  # gone: the guest crashed
    paths.pool.write_bytes(b"pool")
    paths.state_file.write_text(json.dumps(record.to_dict()))
    return paths


def _capture_spawn(monkeypatch) -> list[list[str]]:
    spawned: list[list[str]] = []

    def spawn(argv, g):
        spawned.append(argv)
        # The new guest's agent announces itself as a booted guest would.
        (g.spool / "ready").write_text(json.dumps({"hostname": g.name, "uptime_s": 7.5}))
        g.pidfile.write_text("4242\n")
        return 4242

    monkeypatch.setattr(emulated_rack, "_spawn", spawn)
    monkeypatch.setattr(emulated_rack, "_is_ours", lambda pid, g: pid == 4242)
    return spawned


def test_restart_boots_a_crashed_guest_on_the_same_pool_and_labels(state, kernel, tmp_path, monkeypatch):
    initramfs = tmp_path / "initramfs.cpio"
    initramfs.write_bytes(b"x")
    paths = _lab(state, "r1", initramfs, ssh_port=40022)
    g = paths.guest("lab-1")
    # What the dead guest left in its spool: an agent's files and a request it never ran.
    (g.spool / "ready").write_text(json.dumps({"hostname": "lab-1"}))
    (g.spool / "heartbeat").write_text("1\n")
    (g.spool / "req" / "abc.json").write_text("{}")
    (g.spool / "out" / "abc").mkdir()
    (g.spool / "share" / "keep.txt").write_text("kept")
    spawned = _capture_spawn(monkeypatch)

    report = emulated_rack.restart("r1", "lab-1")

    assert report.was == "crashed" and report.pid == 4242 and report.host == "lab-1"
    (argv,) = spawned
    joined = " ".join(argv)
    assert f"mem-path={paths.pool}," in joined and f"mem-path={g.lsa}," in joined
    assert "sn=1" in joined and "768M" in joined and "hostfwd=tcp:127.0.0.1:40022-:22" in joined
    assert str(kernel.root / "vmlinux") in argv and str(initramfs) in argv
    assert g.lsa.read_bytes() == b"labels" and paths.pool.read_bytes() == b"pool"  # never recreated
    assert not (g.spool / "req" / "abc.json").exists() and not (g.spool / "out" / "abc").exists()
    assert (g.spool / "share" / "keep.txt").read_text() == "kept"
    assert g.console.with_name("console.prev.log").read_text() == "old boot\n"
    saved = emulated_rack.load(paths)
    assert saved is not None and saved.guests[0].pid == 4242 and saved.guests[0].boot_s is not None
    assert saved.guests[1].pid is None  # the other guest is left alone


@pytest.mark.process
def test_restart_refuses_a_running_guest_and_unknown_hosts(state, kernel, tmp_path, monkeypatch):
    initramfs = tmp_path / "i"
    initramfs.write_bytes(b"x")
    paths = _lab(state, "r2", initramfs)
    sleeper = subprocess.Popen(  # noqa: S603 - looks like lab-1's QEMU
        ["qemu-system-x86_64", "-c", "sleep 30", f"file,id=console,path={paths.guest('lab-1').dir}/console.log"],
        executable="/bin/sh", start_new_session=True,
    )
    try:
        paths.guest("lab-1").pidfile.write_text(f"{sleeper.pid}\n")
        (paths.guest("lab-1").spool / "ready").write_text("{}")
        with pytest.raises(UsageError, match="only a crashed or stopped guest"):
            emulated_rack.restart("r2", "lab-1")
        assert sleeper.poll() is None  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(UsageError, match="no host"):
        emulated_rack.restart("r2", "lab-9")
    with pytest.raises(EnvironmentProblem, match="not up"):
        emulated_rack.restart("nolab", "lab-1")


def test_restart_needs_the_labs_kernel_and_files(state, kernel, tmp_path, monkeypatch):
    paths = _lab(state, "r3", tmp_path / "gone.cpio")  # the initramfs was removed from the cache
    _capture_spawn(monkeypatch)
    with pytest.raises(EnvironmentProblem, match="no longer cached"):
        emulated_rack.restart("r3", "lab-1")
    (tmp_path / "gone.cpio").write_bytes(b"x")
    paths.guest("lab-1").lsa.unlink()
    with pytest.raises(EnvironmentProblem, match="label file is missing"):
        emulated_rack.restart("r3", "lab-1")


def test_restart_cli_maps_errors_to_exit_codes(state, capsys):
    from belugactl.cli import app as app_module

    assert app_module.run(["lab", "restart", "--help"]) == 0
    assert "same pool file" in capsys.readouterr().out
    assert app_module.run(["lab", "restart", "--name", "nolab", "lab-1"]) == 3
    assert "belugactl lab up --name nolab" in capsys.readouterr().err
