"""`discover --capture` -> `--root` round trip: the bundle reads back as the same host."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from belugactl.errors import InputError, UsageError
from belugactl.host.capture import open_root, redact_cmdline
from belugactl.host.host import Host
from belugactl.workflows.discover import capture, discover
from tests.support.fixture_trees import ALL_TREES, host, snapshot, tree, without_root


@pytest.mark.parametrize("name", ALL_TREES)
def test_tarball_round_trip_gives_the_same_snapshot(name: str, tmp_path: Path) -> None:
    bundle = tmp_path / f"{name}.tar.gz"
    result = capture(host(name), bundle)
    assert result.path == bundle and bundle.exists()
    assert without_root(result.snapshot.to_dict()) == without_root(snapshot(name).to_dict())
    with open_root(bundle) as back:
        again = discover(back)
    assert without_root(again.to_dict()) == without_root(snapshot(name).to_dict())


def test_directory_round_trip_and_recapture(tmp_path: Path) -> None:
    first = tmp_path / "first"
    capture(host("amd-host"), first)
    second = tmp_path / "second.tgz"
    # A bundle captured from a bundle is still the same host.
    capture(Host.from_tree(first), second)
    with open_root(second) as back:
        assert without_root(discover(back).to_dict()) == without_root(snapshot("amd-host").to_dict())


def test_bundle_links_are_relative_and_stay_inside(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    capture(host("lab-guest"), bundle)
    with tarfile.open(bundle) as tar:
        members = {m.name: m for m in tar.getmembers()}
    links = {n: m.linkname for n, m in members.items() if m.issym()}
    assert links["sys/bus/cxl/devices/mem0"] == "../../../devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/mem0"
    assert all(not target.startswith("/") for target in links.values())
    for name, target in links.items():
        resolved = os.path.normpath(os.path.join(os.path.dirname(name), target))
        assert not resolved.startswith(".."), (name, target)
    assert not any(m.isdev() or m.ischr() for m in members.values())
    assert "dev/dax0.0" not in members  # device nodes travel as metadata
    assert all(not n.startswith("/") for n in members)


def test_bundle_metadata(tmp_path: Path) -> None:
    out = tmp_path / "amd"
    result = capture(host("amd-host"), out)
    devnodes = json.loads((out / ".belugactl/devnodes.json").read_text())
    assert devnodes == {"/dev/dax0.0": {"mode": 0o660, "uid": 0, "gid": 1001, "owner": "root",
                                        "group": "beluga", "is_char": True}}
    meta = json.loads((out / ".belugactl/capture.json").read_text())
    assert meta["hostname"] == "beluga-amd-01"
    assert meta["tool_paths"]["ndctl"] == "/usr/bin/ndctl"
    commands = json.loads((out / ".belugactl/commands.json").read_text())["commands"]
    assert ["cxl", "list", "-M", "-i"] in [c["argv"] for c in commands]
    assert result.commands == len(commands)
    assert result.files > 50 and result.links > 20


def test_only_paths_discovery_reads_are_captured(tmp_path: Path) -> None:
    source = tmp_path / "source"
    capture(host("nocxl"), source)
    # Files discovery never reads must never reach a bundle, wherever they sit.
    (source / "etc").mkdir()
    (source / "etc/shadow").write_text("root:secret\n")
    (source / "proc/sys/kernel/random_secret").write_text("nope\n")
    (source / "sys/devices/system/node/node0/unrelated").write_text("x\n")
    bundle = tmp_path / "b.tar.gz"
    capture(Host.from_tree(source), bundle)
    with tarfile.open(bundle) as tar:
        names = set(tar.getnames())
    assert "proc/cpuinfo" in names
    assert not {"etc/shadow", "proc/sys/kernel/random_secret", "sys/devices/system/node/node0/unrelated"} & names


@pytest.mark.process
def test_capture_of_this_machine_reads_back(tmp_path: Path) -> None:
    bundle = tmp_path / "live.tar.gz"
    live = capture(Host.local(), bundle)
    with open_root(bundle) as back:
        again = discover(back)
    before, after = without_root(live.snapshot.to_dict()), without_root(again.to_dict())
    # Free memory moves between two reads of a live machine; everything else must match.
    for node in before["numa"] + after["numa"]:
        node.pop("mem_free")
    before.pop("hugepages"), after.pop("hugepages")
    for node in before["numa"] + after["numa"]:
        node.pop("hugepages")
    assert after == before


def test_capture_refuses_a_nonempty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(UsageError):
        capture(host("nocxl"), tmp_path)


def test_open_root_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError), open_root(tmp_path / "missing"):
        pass
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    with pytest.raises(UsageError), open_root(plain):
        pass
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError), open_root(broken):
        pass


def test_open_root_refuses_links_out_of_the_tree(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("sys/escape")
        info.type, info.linkname = tarfile.SYMTYPE, "../../../../etc"
        tar.addfile(info)
    with pytest.raises(InputError), open_root(evil):
        pass


def test_open_root_cleans_up(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    capture(host("nocxl"), bundle)
    with open_root(bundle) as back:
        unpacked = Path(back.root)
        assert (unpacked / "proc/cpuinfo").exists()
    assert not unpacked.exists()


def test_fixture_tree_is_a_valid_root() -> None:
    with open_root(tree("lab-guest")) as back:
        assert back.root == tree("lab-guest")


# --- secrets on the kernel command line ----------------------------------------------------------

SECRET_CMDLINE = (
    'BOOT_IMAGE=/vmlinuz-6.1 root=UUID=0a1b ro quiet rd.luks.key=/keys/pool.bin:UUID=77 rootpassword=hunter2 '
    'api_token=abc123 password="two words" inst.ks=http://admin:s3cret@10.0.0.1/ks.cfg pw=x '
    "console=ttyS0,115200 spec_store_bypass_disable=on usbcore.authorized_default=0 mitigations=off\n"
)
REDACTED_CMDLINE = (
    "BOOT_IMAGE=/vmlinuz-6.1 root=UUID=0a1b ro quiet rd.luks.key=<redacted> rootpassword=<redacted> "
    "api_token=<redacted> password=<redacted> inst.ks=http://admin:<redacted>@10.0.0.1/ks.cfg pw=<redacted> "
    "console=ttyS0,115200 spec_store_bypass_disable=on usbcore.authorized_default=0 mitigations=off\n"
)


def test_redact_cmdline_keeps_keys_and_ordinary_parameters() -> None:
    assert redact_cmdline(SECRET_CMDLINE) == REDACTED_CMDLINE
    plain = "console=ttyS0 loglevel=4 panic=-1 rdinit=/init mitigations=off\n"
    assert redact_cmdline(plain) == plain


@pytest.mark.parametrize("suffix", [".tar.gz", ""])
def test_capture_redacts_secrets_from_the_kernel_command_line(tmp_path: Path, suffix: str) -> None:
    import shutil

    source = tmp_path / "source"
    shutil.copytree(tree("lab-guest"), source, symlinks=True)
    (source / "proc/cmdline").write_text(SECRET_CMDLINE)
    bundle = tmp_path / f"bundle{suffix}"
    capture(Host.from_tree(source), bundle)
    with open_root(bundle) as back:
        assert back.read_text("/proc/cmdline") == REDACTED_CMDLINE
        assert discover(back).kernel.cmdline == REDACTED_CMDLINE.strip()
        for secret in ("hunter2", "abc123", "s3cret", "pool.bin", "two words"):
            assert all(secret not in p.read_text(errors="replace") for p in Path(back.root).rglob("*") if p.is_file())
