import struct
from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem
from belugactl.lab import accel, prereqs


def _elf(path: Path, *, interp: bool) -> Path:
    """A minimal 64-bit little-endian ELF header with one program header."""
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5] = 2, 1
    struct.pack_into("<Q", header, 32, 64)  # e_phoff
    struct.pack_into("<HH", header, 54, 56, 1)  # e_phentsize, e_phnum
    ph = bytearray(56)
    struct.pack_into("<I", ph, 0, 3 if interp else 1)  # PT_INTERP or PT_LOAD
    path.write_bytes(bytes(header + ph))
    return path


def test_static_elf_detection(tmp_path):
    assert prereqs.is_static_elf(_elf(tmp_path / "static", interp=False))
    assert not prereqs.is_static_elf(_elf(tmp_path / "dynamic", interp=True))
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not prereqs.is_static_elf(tmp_path / "text")


def test_require_names_the_debian_packages(monkeypatch):
    monkeypatch.setattr(prereqs, "find_program", lambda name: None)
    with pytest.raises(EnvironmentProblem) as info:
        prereqs.require()
    err = info.value
    assert err.exit_code == 3
    for pkg in ("qemu-system-x86", "ndctl", "daxctl", "busybox-static", "kmod"):
        assert pkg in err.what and pkg in (err.fix or "")


def test_dynamic_busybox_is_reported(monkeypatch, tmp_path):
    fake = _elf(tmp_path / "busybox", interp=True)
    monkeypatch.setattr(prereqs, "find_program", lambda name: fake if name == "busybox" else tmp_path / name)
    monkeypatch.setattr(prereqs, "is_static_elf", lambda p: False)
    missing = prereqs.check()
    assert [m.requirement.package for m in missing] == ["busybox-static"]
    assert "dynamically linked" in missing[0].reason


def test_kvm_probe_reports_a_missing_device(tmp_path):
    usable, detail = accel.probe_kvm(str(tmp_path / "kvm"))
    assert not usable and "does not exist" in detail


def test_auto_means_tcg_whatever_kvm_says():
    report = accel.choose("auto")
    assert report.chosen == "tcg"
    assert accel.choose("kvm").chosen == "kvm"
