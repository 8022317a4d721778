"""`--root BUNDLE.tar.gz` is untrusted input: bounded unpacking, nothing outside the root."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from belugactl.errors import InputError
from belugactl.host import capture as capture_module
from belugactl.host.capture import open_root


def _bundle(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    data = data or {}
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _refused(bundle: Path) -> InputError:
    with pytest.raises(InputError) as info, open_root(bundle):
        pass
    assert "refusing to unpack" in info.value.what or "cannot unpack" in info.value.what
    return info.value


def test_member_count_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "MAX_BUNDLE_MEMBERS", 10)
    names = [f"proc/f{i}" for i in range(11)]
    bundle = _bundle(tmp_path / "b.tar.gz", [_file(n) for n in names], {n: b"x" for n in names})
    assert "more than 10 members" in _refused(bundle).why


def test_total_bytes_are_capped_before_they_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "MAX_BUNDLE_BYTES", 1000)
    names = ["proc/a", "proc/b"]
    bundle = _bundle(tmp_path / "b.tar.gz", [_file(n) for n in names], {n: b"0" * 600 for n in names})
    unpacked: list[str] = []
    real_mkdtemp = capture_module.tempfile.mkdtemp

    def mkdtemp(**kw: str) -> str:
        unpacked.append(real_mkdtemp(**kw))
        return unpacked[-1]

    monkeypatch.setattr(capture_module.tempfile, "mkdtemp", mkdtemp)
    assert "more than 1000 bytes" in _refused(bundle).why
    assert not Path(unpacked[0]).exists()  # the partial tree is removed too


def test_one_huge_member_is_refused_from_its_header(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "MAX_BUNDLE_MEMBER_BYTES", 100)
    bundle = _bundle(tmp_path / "b.tar.gz", [_file("proc/big")], {"proc/big": b"0" * 101})
    assert "proc/big: 101 bytes" in _refused(bundle).why


@pytest.mark.parametrize(
    "member",
    [
        _link("sys/escape", "../../etc/passwd"),
        _link("sys/abs", "/etc/passwd"),
        _link("sys/hard", "etc/passwd", tarfile.LNKTYPE),
    ],
    ids=["relative-escape", "absolute", "hardlink"],
)
def test_links_out_of_the_root_and_hardlinks_are_refused(tmp_path, member):
    _refused(_bundle(tmp_path / "b.tar.gz", [member]))


def test_device_and_parent_paths_are_refused(tmp_path):
    dev = tarfile.TarInfo("dev/dax0.0")
    dev.type = tarfile.CHRTYPE
    _refused(_bundle(tmp_path / "dev.tar.gz", [dev]))
    _refused(_bundle(tmp_path / "up.tar.gz", [_file("../outside")], {"../outside": b"x"}))


def test_a_link_inside_the_root_is_fine(tmp_path):
    members = [_file("sys/devices/a"), _link("sys/bus/a", "../devices/a")]
    bundle = _bundle(tmp_path / "ok.tar.gz", members, {"sys/devices/a": b"1\n"})
    with open_root(bundle) as host:
        assert host.read_text("/sys/bus/a").strip() == "1"
