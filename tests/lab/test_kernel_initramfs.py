import json
import stat
from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem
from belugactl.lab import cpio, initramfs, kernel

VERSION = "6.1.0-99-amd64"


def _fake_kernel(root: Path) -> kernel.GuestKernel:
    """A kernel tree shaped like an unpacked and depmod-ed Debian linux-image package."""
    mods = root / "lib" / "modules" / VERSION
    (root / "boot").mkdir(parents=True)
    (root / "boot" / f"vmlinuz-{VERSION}").write_bytes(b"kernel")
    (root / "boot" / f"config-{VERSION}").write_text("CONFIG_CXL_BUS=y\nCONFIG_CXL_PCI=m\n# CONFIG_X is not set\n")
    dep = {
        "kernel/drivers/virtio/virtio.ko": [],
        "kernel/drivers/virtio/virtio_ring.ko": [],
        "kernel/drivers/virtio/virtio_pci.ko": ["kernel/drivers/virtio/virtio_ring.ko",
                                                "kernel/drivers/virtio/virtio.ko"],
        "kernel/net/9p/9pnet.ko": [],
        "kernel/net/9p/9pnet_virtio.ko": ["kernel/drivers/virtio/virtio_ring.ko", "kernel/net/9p/9pnet.ko",
                                          "kernel/drivers/virtio/virtio.ko"],
        "kernel/fs/netfs/netfs.ko": [],
        "kernel/fs/9p/9p.ko": ["kernel/fs/netfs/netfs.ko", "kernel/net/9p/9pnet.ko"],
        "kernel/fs/overlayfs/overlay.ko": [],
    }
    for path in dep:
        (mods / path).parent.mkdir(parents=True, exist_ok=True)
        (mods / path).write_bytes(f"module {path}".encode())
    (mods / "modules.dep").write_text("".join(f"{p}: {' '.join(d)}\n" for p, d in dep.items()))
    (mods / "modules.builtin").write_text("kernel/drivers/cxl/core/cxl_core.ko\n")
    (root / "belugactl-kernel.json").write_text(json.dumps({"version": VERSION, "package": f"linux-image-{VERSION}"}))
    return kernel.GuestKernel(VERSION, f"linux-image-{VERSION}", root)


def test_module_paths_puts_dependencies_first_and_skips_builtins(tmp_path):
    k = _fake_kernel(tmp_path / "k")
    order = kernel.module_paths(k.modules_dir, ["9p", "virtio_pci", "cxl_core"])
    names = [p.rsplit("/", 1)[1] for p in order]
    assert names.index("netfs.ko") < names.index("9p.ko")
    assert names.index("9pnet.ko") < names.index("9p.ko")
    assert names.index("virtio.ko") < names.index("virtio_pci.ko")
    assert len(names) == len(set(names))
    assert "cxl_core.ko" not in names


def test_unknown_module_is_an_environment_problem(tmp_path):
    k = _fake_kernel(tmp_path / "k")
    with pytest.raises(EnvironmentProblem, match="no module"):
        kernel.module_paths(k.modules_dir, ["cxl_nonexistent"])


def test_cached_kernels_are_found_and_half_unpacked_ones_ignored(tmp_path):
    cache = tmp_path / "cache"
    _fake_kernel(kernel.kernels_dir(cache) / VERSION)
    (kernel.kernels_dir(cache) / ".6.1.0-100-amd64.tmp" / "boot").mkdir(parents=True)  # interrupted unpack
    found = kernel.cached(cache)
    assert [k.version for k in found] == [VERSION]
    assert kernel.config_value(found[0], "CONFIG_CXL_PCI") == "m"
    assert kernel.config_value(found[0], "CONFIG_X") is None


def test_version_of_package():
    assert kernel.version_of_package("linux-image-6.1.0-57-amd64") == "6.1.0-57-amd64"
    with pytest.raises(EnvironmentProblem):
        kernel.version_of_package("linux-headers-6.1.0-57-amd64")


def test_initramfs_holds_init_console_busybox_and_boot_modules_in_load_order(tmp_path):
    k = _fake_kernel(tmp_path / "k")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF fake busybox")
    image = initramfs.build(k, tmp_path / "cache", busybox)
    entries = {e.name: e for e in cpio.read(image.path.read_bytes())}
    assert stat.S_ISCHR(entries["dev/console"].mode) and entries["dev/console"].rdev == (5, 1)
    assert entries["bin/busybox"].data == busybox.read_bytes()
    init = entries["init"].data.decode()
    assert init.startswith("#!/bin/sh") and entries["init"].mode & 0o111
    for tag in (initramfs.HOSTROOT_TAG, initramfs.SPOOL_TAG, initramfs.REPO_TAG, initramfs.GUEST_SPOOL):
        assert tag in init
    assert "@" not in init.replace("$@", "")  # every placeholder filled in
    order = entries["etc/boot-modules"].data.decode().split()
    assert order.index("9pnet.ko") < order.index("9p.ko") and "overlay.ko" in order
    assert all(f"lib/modules/boot/{m}" in entries for m in order)


def test_initramfs_is_rebuilt_only_when_an_input_changes(tmp_path):
    k = _fake_kernel(tmp_path / "k")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"one")
    first = initramfs.build(k, tmp_path / "cache", busybox)
    again = initramfs.build(k, tmp_path / "cache", busybox)
    assert again.path == first.path
    busybox.write_bytes(b"two")
    changed = initramfs.build(k, tmp_path / "cache", busybox)
    assert changed.path != first.path
    assert not first.path.exists()  # the stale image is gone


def _bzimage(payload: bytes) -> bytes:
    import lzma

    return b"MZ real-mode setup and decompressor stub \xfd7zXZ\x00 (not a stream)" + lzma.compress(
        payload, format=lzma.FORMAT_XZ
    ) + b"\0" * 64


def test_extract_vmlinux_finds_the_elf_inside_a_bzimage():
    elf = b"\x7fELF" + bytes(range(256)) * 40
    assert kernel.extract_vmlinux(_bzimage(elf)) == elf
    assert kernel.extract_vmlinux(b"no payload here") is None


def test_boot_image_is_the_extracted_elf_only_for_pvh_kernels(tmp_path):
    k = _fake_kernel(tmp_path / "k")
    elf = b"\x7fELF" + b"kernel" * 100
    k.vmlinuz.write_bytes(_bzimage(elf))
    assert kernel.boot_image(k) == k.vmlinuz  # the fake config has no CONFIG_PVH
    k.config.write_text(k.config.read_text() + "CONFIG_PVH=y\n")
    assert kernel.boot_image(k) == k.vmlinux and k.vmlinux.read_bytes() == elf
