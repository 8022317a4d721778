"""Every lab guest's QEMU has a QMP socket in its directory (lab/qemu.py), and lab/qmp.py speaks it:
against a real QEMU with no machine, a query answers, and Debian 12's QEMU 7.2 (the pmem profile's)
has no `cxl-inject-poison` (CommandNotFound), which is why the poison lab test runs on the ram
profile's QEMU 10."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from belugactl.lab import qemu
from belugactl.lab.qmp import QmpError, qmp_command


def _spec(d: Path, **kw) -> qemu.GuestSpec:
    g = d / "guests" / "lab-1"
    return qemu.GuestSpec(name="lab-1", index=1, kernel=d / "vmlinuz", initramfs=d / "initrd", pool=d / "pool",
                          pool_size=512 << 20, lsa=g / "lsa.raw", spool=g / "spool", console=g / "console.log",
                          **kw)  # fmt: skip


def test_every_guest_listens_for_qmp_in_its_directory(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="q", dir="/tmp"))
    try:
        for profile_kw in ({}, {"profile": "ram", "ram": object()}):
            spec = _spec(short, **profile_kw)
            sock = short / "guests" / "lab-1" / "qmp.sock"
            assert qemu.qmp_socket(spec) == sock
            assert qemu.qmp_args(spec) == ["-qmp", f"unix:{sock},server=on,wait=off"]
        argv = qemu.argv(_spec(short))
        assert argv[argv.index("-qmp") + 1].startswith(f"unix:{short}/guests/lab-1/qmp.sock,")
    finally:
        shutil.rmtree(short)
    # A path too long for a unix socket: no monitor rather than a QEMU that refuses to start.
    deep = _spec(tmp_path / ("x" * 120))
    assert qemu.qmp_socket(deep) is None and "-qmp" not in qemu.argv(deep)


@pytest.mark.process
def test_the_client_talks_to_a_real_qemu_and_its_errors_name_the_class() -> None:
    binary = shutil.which(qemu.QEMU)
    if binary is None:
        pytest.skip(f"{qemu.QEMU} not installed")
    d = Path(tempfile.mkdtemp(prefix="q", dir="/tmp"))
    sock = d / "qmp.sock"
    proc = subprocess.Popen([binary, "-machine", "none", "-nodefaults", "-display", "none",  # noqa: S603
                             "-qmp", f"unix:{sock},server=on,wait=off"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        version = qmp_command(sock, "query-version")
        assert version["qemu"]["major"] >= 7
        if version["qemu"]["major"] < 8:  # Debian 12's: no CXL error injection at all
            with pytest.raises(QmpError) as err:
                qmp_command(sock, "cxl-inject-poison", {"path": "/machine/peripheral/x", "start": 0, "length": 64})
            assert err.value.klass == "CommandNotFound"
        names = {c["name"] for c in qmp_command(sock, "query-commands")}
        assert ("cxl-inject-poison" in names) == (version["qemu"]["major"] >= 8)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(d)
