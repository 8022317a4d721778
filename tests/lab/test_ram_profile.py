"""The ram profile without booting anything: QEMU argv, apt isolation, the initramfs's tools, region geometry."""

import json
import lzma
import os
from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem, StepFailed, UsageError
from belugactl.lab import cpio, debstack, emulated_rack, initramfs, qemu, ramregion, topology
from belugactl.lab.kernel import GuestKernel
from belugactl.lab.paths import STATE_ENV
from tests.support.lab import run_cli

MIB = 1024 * 1024


def _pairs(argv: list[str]) -> list[tuple[str, str]]:
    flags = range(len(argv) - 1)
    return [(argv[i], argv[i + 1]) for i in flags if argv[i].startswith("-") and not argv[i + 1].startswith("-")]


def test_switch_topology_is_the_recorded_one(tmp_path):
    topo = topology.RamTopology((Path("/p/sw0.raw"), Path("/p/sw1.raw")), 256 * MIB, switch=True)
    assert topology.cxl_args(topo) == [
        "-object", f"memory-backend-file,id=vmem0,share=on,mem-path=/p/sw0.raw,size={256 * MIB}",
        "-object", f"memory-backend-file,id=vmem1,share=on,mem-path=/p/sw1.raw,size={256 * MIB}",
        "-device", "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1",
        "-device", "cxl-rp,port=0,bus=cxl.1,id=rp0,chassis=0,slot=2",
        "-device", "cxl-upstream,bus=rp0,id=us0",
        "-device", "cxl-downstream,port=0,bus=us0,id=swport0,chassis=0,slot=4",
        "-device", "cxl-downstream,port=1,bus=us0,id=swport1,chassis=0,slot=5",
        "-device", "cxl-type3,bus=swport0,volatile-memdev=vmem0,id=cxl-vmem0,sn=0x10",
        "-device", "cxl-type3,bus=swport1,volatile-memdev=vmem1,id=cxl-vmem1,sn=0x11",
        "-M", "cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G,cxl-fmw.0.interleave-granularity=4k",
    ]  # fmt: skip


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_without_a_switch_every_device_has_its_own_root_port_and_there_are_at_least_two(devices):
    topo = topology.RamTopology(tuple(Path(f"/p/pool-{i}.raw") for i in range(devices)), 256 * MIB)
    args = topology.cxl_args(topo)
    devs = [v for k, v in _pairs(args) if k == "-device"]
    ports = [d for d in devs if d.startswith("cxl-rp,")]
    t3 = [dict(kv.split("=") for kv in d.split(",")[1:]) for d in devs if d.startswith("cxl-type3,")]
    assert len(ports) == max(2, devices)
    assert [t["bus"] for t in t3] == [f"rp{i}" for i in range(devices)]
    assert len({t["sn"] for t in t3}) == devices
    assert not any(d.startswith(("cxl-upstream", "cxl-downstream")) for d in devs)


@pytest.mark.parametrize(
    ("devices", "size", "window"),
    [(1, 512 * MIB, 4 << 30), (2, 256 * MIB, 4 << 30), (4, 2048 * MIB, 8 << 30), (3, 2048 * MIB, 6 << 30),
     (8, 1024 * MIB, 8 << 30)],
)  # fmt: skip
def test_the_window_holds_an_n_way_region_across_every_device(devices, size, window):
    got = topology.window_size(devices, size)
    assert got == window
    assert got >= devices * size and got % (devices * topology.DECODER_UNIT) == 0


def test_bad_topologies_are_refused():
    with pytest.raises(ValueError):
        topology.cxl_args(topology.RamTopology((), 256 * MIB))
    with pytest.raises(ValueError):
        topology.cxl_args(topology.RamTopology((Path("/p/a"),), 100 * MIB))


def _spec(tmp_path: Path, name: str, index: int, **kw) -> qemu.GuestSpec:
    g = tmp_path / "guests" / name
    return qemu.GuestSpec(name=name, index=index, kernel=tmp_path / "vmlinuz", initramfs=tmp_path / "initrd",
                          pool=tmp_path / "pool.raw", pool_size=512 * MIB, lsa=g / "lsa.raw", spool=g / "spool",
                          console=g / "console.log", **kw)  # fmt: skip


def test_ram_guests_hide_the_hypervisor_bit_use_the_new_firmware_and_share_files_and_serials(tmp_path):
    topo = topology.RamTopology((tmp_path / "pool-0.raw", tmp_path / "pool-1.raw"), 256 * MIB, switch=True)
    fw = tmp_path / "firmware"
    a = qemu.argv(_spec(tmp_path, "lab-1", 1, profile="ram", ram=topo, firmware=fw), "/tree/qemu-system-x86_64")
    b = qemu.argv(_spec(tmp_path, "lab-2", 2, profile="ram", ram=topo, firmware=fw), "/tree/qemu-system-x86_64")
    assert a[:3] == ["/tree/qemu-system-x86_64", "-L", str(fw)]
    assert ("-cpu", "max,hypervisor=off") in _pairs(a)
    assert not any("lsa" in v or "cxl-pmem" in v for v in a)
    cxl_a = [v for v in a if "vmem" in v or "cxl-fmw" in v]
    cxl_b = [v for v in b if "vmem" in v or "cxl-fmw" in v]
    assert cxl_a == cxl_b  # the same files, the same serials: one set of devices seen by every host
    assert qemu.is_guest_process(a, tmp_path / "guests" / "lab-1")


def test_pmem_argv_is_unchanged_by_the_ram_profile(tmp_path):
    a = qemu.argv(_spec(tmp_path, "lab-1", 1))
    assert a[0] == "qemu-system-x86_64" and "-L" not in a
    assert ("-cpu", "max") in _pairs(a)
    assert any(v.startswith("cxl-type3,bus=rp0,memdev=cxl-mem1,lsa=cxl-lsa1") for v in a)
    with pytest.raises(ValueError):
        qemu.argv(_spec(tmp_path, "lab-1", 1, profile="ram"))  # no topology


def test_validate_keeps_devices_and_switch_to_the_ram_profile():
    emulated_rack.validate(2, 512 * MIB, 1024, profile="ram", devices=2, switch=True)
    with pytest.raises(UsageError):
        emulated_rack.validate(2, 512 * MIB, 1024, profile="pmem", devices=2)
    with pytest.raises(UsageError):
        emulated_rack.validate(2, 512 * MIB, 1024, profile="pmem", switch=True)
    with pytest.raises(UsageError, match="split"):
        emulated_rack.validate(2, 768 * MIB, 1024, profile="ram", devices=2)
    with pytest.raises(UsageError):
        emulated_rack.validate(2, 512 * MIB, 1024, profile="disk")


@pytest.mark.process
def test_cli_refuses_bad_profile_options_with_exit_2(tmp_path):
    env = dict(os.environ, **{STATE_ENV: str(tmp_path)})
    r = run_cli(env, "lab", "up", "--profile", "pmem", "--devices", "2", timeout=60)
    assert r.returncode == 2 and "--profile ram" in r.stderr
    r = run_cli(env, "lab", "prepare", "--profile", "nvme", timeout=60)
    assert r.returncode == 2 and "--profile" in r.stderr
    assert not list(tmp_path.iterdir())


# --- debstack ------------------------------------------------------------------------------------
def test_apt_reads_and_writes_only_the_private_folder(tmp_path):
    opts = debstack.apt_options(tmp_path / "apt")
    values = dict(o.split("=", 1) for o in opts[1::2])
    assert opts[0::2] == ["-o"] * len(values)
    for key in ("Dir::Etc::SourceList", "Dir::State::Lists", "Dir::State::status", "Dir::Cache",
                "Dir::Etc::Preferences", "Dir::State::extended_states"):
        assert values[key].startswith(str(tmp_path / "apt")), key
    assert values["Dir::Etc::SourceParts"] == "/dev/null" and values["Dir::Etc::PreferencesParts"] == "/dev/null"
    lines = debstack.sources_list().splitlines()
    assert [line.split()[-2] for line in lines] == ["bookworm-backports", "trixie"]
    assert all("signed-by=" in line for line in lines)


def test_qemu_comes_from_backports_and_everything_else_from_trixie():
    plan = dict(debstack.package_plan("linux-image-6.12.9+deb13-amd64-unsigned"))
    assert plan["qemu-system-x86"] == plan["qemu-system-data"] == "bookworm-backports"
    assert plan["seabios"] == plan["cxl"] == plan["libc6"] == plan["libssl3t64"] == "trixie"
    assert plan["linux-image-6.12.9+deb13-amd64-unsigned"] == "trixie"


def test_parsers_of_apt_output():
    show = "Package: linux-image-amd64\nVersion: 6.12.117-1\nDepends: linux-image-6.12.117+deb13-amd64 (= 6.12.117-1)\n"
    assert debstack.parse_kernel_depends(show) == "linux-image-6.12.117+deb13-amd64"
    assert debstack.parse_kernel_depends("Package: x\n") is None
    assert debstack.parse_deb_name("qemu-system-x86_1%3a10.0.2+ds-2+deb13u1~bpo12+1_amd64.deb") == (
        "qemu-system-x86", "1:10.0.2+ds-2+deb13u1~bpo12+1")
    assert debstack.parse_deb_name("notadeb.txt") is None
    assert debstack._kernel_version("linux-image-6.12.117+deb13-amd64-unsigned") == "6.12.117+deb13-amd64"


def test_firmware_folder_resolves_absolute_links_inside_the_tree_not_the_host(tmp_path):
    tree = tmp_path / "tree"
    (tree / "usr/share/seabios").mkdir(parents=True)
    (tree / "usr/share/qemu").mkdir(parents=True)
    (tree / "usr/share/seabios/bios-256k.bin").write_bytes(b"new seabios")
    (tree / "usr/share/qemu/vgabios.bin").symlink_to("/usr/share/seabios/bios-256k.bin")
    (tree / "usr/share/qemu/kvmvapic.bin").write_bytes(b"vapic")
    debstack._build_firmware(tree, tmp_path / "fw")
    assert (tmp_path / "fw/bios-256k.bin").read_bytes() == b"new seabios"
    assert (tmp_path / "fw/vgabios.bin").read_bytes() == b"new seabios"
    assert not (tmp_path / "fw/vgabios.bin").is_symlink()
    assert (tmp_path / "fw/kvmvapic.bin").read_bytes() == b"vapic"


def test_a_stack_without_firmware_is_not_taken_for_ready(tmp_path):
    tree = tmp_path / "ram" / "tree"
    (tree / "usr/bin").mkdir(parents=True)
    (tree / "usr/bin/qemu-system-x86_64").write_bytes(b"")
    (tree / "boot").mkdir()
    (tree / "boot/vmlinuz-6.12.1-amd64").write_bytes(b"")
    (tree / "belugactl-ram-stack.json").write_text(json.dumps(
        {"kernel_version": "6.12.1-amd64", "kernel_package": "linux-image-6.12.1-amd64", "packages": []}))
    assert debstack.load(tmp_path) is None
    (tmp_path / "ram/firmware").mkdir()
    (tmp_path / "ram/firmware/bios-256k.bin").write_bytes(b"")
    assert debstack.load(tmp_path).kernel.vmlinuz.name == "vmlinuz-6.12.1-amd64"


# --- initramfs -----------------------------------------------------------------------------------
LIST_OUTPUT = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibcxl.so.1 => /t/usr/lib/x86_64-linux-gnu/libcxl.so.1 (0x00007f)
\tlibc.so.6 => /t/usr/lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
\t/lib64/ld-linux-x86-64.so.2 => /t/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 (0x00007f)
"""


def test_loader_list_is_parsed_and_a_missing_library_is_an_error():
    assert initramfs.parse_loader_list(LIST_OUTPUT) == [
        "/t/usr/lib/x86_64-linux-gnu/libcxl.so.1", "/t/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/t/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"]  # fmt: skip
    with pytest.raises(EnvironmentProblem, match="libtracefs"):
        initramfs.parse_loader_list(LIST_OUTPUT + "\tlibtracefs.so.1 => not found\n")


def test_wrappers_run_the_tools_with_the_trees_loader_and_libraries():
    text = initramfs.wrapper("cxl")
    assert text.startswith("#!/bin/sh\n")
    assert "exec /opt/belugactl-cxl/lib/ld-linux-x86-64.so.2 --library-path /opt/belugactl-cxl/lib" in text
    assert text.rstrip().endswith('/opt/belugactl-cxl/libexec/cxl "$@"')


def test_xz_boot_modules_are_decompressed_for_busybox_insmod(tmp_path):
    version = "6.12.1-amd64"
    root = tmp_path / "k"
    mods = root / "usr/lib/modules" / version
    (mods / "kernel/fs").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    for name in ("9pnet", "9pnet_virtio", "9p", "overlay"):
        (mods / f"kernel/fs/{name}.ko.xz").write_bytes(lzma.compress(f"elf {name}".encode(), format=lzma.FORMAT_XZ))
    (mods / "modules.dep").write_text(
        "kernel/fs/9pnet.ko.xz:\nkernel/fs/9pnet_virtio.ko.xz: kernel/fs/9pnet.ko.xz\n"
        "kernel/fs/9p.ko.xz: kernel/fs/9pnet.ko.xz\nkernel/fs/overlay.ko.xz:\n")
    (mods / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"bb")
    items, names = initramfs.entries(GuestKernel(version, "linux-image-x", root), busybox)
    assert names == ("9pnet.ko", "9pnet_virtio.ko", "9p.ko", "overlay.ko")
    files = {e.name: e.data for e in items}
    assert files["lib/modules/boot/9p.ko"] == b"elf 9p"
    assert files["etc/boot-modules"].decode().split() == list(names)
    assert not any(n.startswith("opt/") for n in files)  # no tools unless asked for


def test_init_binds_the_tools_into_the_chroot_only_when_the_image_has_them():
    script = initramfs.init_script()
    assert "if [ -d /opt/belugactl-cxl ]; then" in script
    assert "mount --bind /opt/belugactl-cxl $R/opt/belugactl-cxl" in script
    assert "@" not in script.replace("$@", "")


def test_ram_lab_path_puts_the_tools_first():
    assert emulated_rack._guest_path(Path("/v"), "ram").startswith("/opt/belugactl-cxl/bin:/v/bin:")
    assert emulated_rack._guest_path(Path("/v")).startswith("/v/bin:")


def test_cpio_of_tools_holds_wrappers_binaries_and_libraries(tmp_path, monkeypatch):
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libc.so.6").write_bytes(b"libc")
    (libdir / "ld-linux-x86-64.so.2").write_bytes(b"ld")
    bindir = tmp_path / "usr/bin"
    bindir.mkdir()
    (bindir / "cxl").write_bytes(b"cxl-elf")
    tools = initramfs.RamTools(bindir, libdir, ("cxl",))
    monkeypatch.setattr(initramfs.RamTools, "libraries", lambda self: [libdir / "ld-linux-x86-64.so.2",
                                                                          libdir / "libc.so.6"])
    entries = {e.name: e for e in cpio.read(_archive(initramfs.tool_entries(tools)))}
    assert entries["opt/belugactl-cxl/libexec/cxl"].data == b"cxl-elf"
    assert entries["opt/belugactl-cxl/lib/libc.so.6"].data == b"libc"
    assert entries["opt/belugactl-cxl/bin/cxl"].data == initramfs.wrapper("cxl").encode()
    assert entries["opt/belugactl-cxl/bin/cxl"].mode & 0o111


def _archive(items):
    import io

    buf = io.BytesIO()
    cpio.write(buf, items)
    return buf.getvalue()


# --- ram regions ---------------------------------------------------------------------------------
def test_memdevs_parse_raw_and_human_serials_and_order_by_serial_not_name():
    raw = json.dumps([{"memdev": "mem0", "serial": 17, "ram_size": 1}, {"memdev": "mem1", "serial": 16}])
    human = json.dumps([{"memdev": "mem0", "serial": "0x11"}, {"memdev": "mem1", "serial": "0x10"}])
    for text in (raw, human):
        ordered = ramregion.by_serial(ramregion.parse_memdevs(text))
        assert [m.name for m in ordered] == ["mem1", "mem0"]  # the probe order seen on one lab host
    assert ramregion.parse_memdevs(json.dumps({"memdev": "mem0", "serial": 1})) == [ramregion.Memdev("mem0", 1)]
    assert ramregion.parse_memdevs("") == []
    with pytest.raises(StepFailed, match="serial"):
        ramregion.by_serial([ramregion.Memdev("mem0", 1), ramregion.Memdev("mem1", 1)])


def test_backing_positions_match_the_recorded_striping():
    # qemu-cxl-lab-v2.md: 0 -> sw0@0, 0x1000 -> sw1@0, 0x2000 -> sw0@0x1000, 0x3000 -> sw1@0x1000.
    got = [ramregion.backing_position(off, 2, 4096) for off in (0, 0x1000, 0x2000, 0x3000, 0x3008)]
    assert got == [(0, 0), (1, 0), (0, 0x1000), (1, 0x1000), (1, 0x1008)]
    assert ramregion.backing_position(0x5000, 1, 4096) == (0, 0x5000)
    assert ramregion.backing_position(3 * 256 + 5, 4, 256) == (3, 5)


def _elf(body: bytes) -> bytes:
    """A 64-bit ELF header whose (empty) section table ends exactly at the end of the data."""
    import struct

    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    size = 64 + len(body)
    struct.pack_into("<Q", head, 0x28, size)  # e_shoff: right at the end
    struct.pack_into("<HH", head, 0x3A, 64, 0)  # e_shentsize, e_shnum
    return bytes(head) + body


@pytest.mark.process
@pytest.mark.skipif(not __import__("shutil").which("zstd"), reason="needs the zstd program")
def test_kernel_612s_zstd_payload_is_extracted_and_a_cut_one_is_not():
    import subprocess

    from belugactl.lab import kernel

    elf = _elf(b"kernel text " * 100)
    payload = subprocess.run(["zstd", "-c", "-q"], input=elf, capture_output=True, check=True).stdout
    assert kernel.extract_vmlinux(b"setup" * 10 + payload + b"\x00trailer") == elf
    # Truncated output (the section table beyond the data) is refused rather than booted.
    short = _elf(b"x" * 32)[:-8]
    cut = subprocess.run(["zstd", "-c", "-q"], input=short, capture_output=True, check=True).stdout
    assert kernel.extract_vmlinux(b"setup" + cut) is None


def test_restart_of_a_ram_guest_reuses_the_shared_device_files_and_the_stacks_qemu(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))
    tree = tmp_path / "cache" / "ram" / "tree"
    stack = debstack.RamStack(tmp_path / "cache" / "ram", "6.12.1-amd64", "linux-image-6.12.1-amd64", ())
    monkeypatch.setattr(debstack, "load", lambda cache: stack)
    monkeypatch.setattr(emulated_rack.kernel_mod, "boot_image", lambda kern: kern.root / "vmlinux")
    initramfs_file = tmp_path / "initramfs.cpio"
    initramfs_file.write_bytes(b"x")
    paths = emulated_rack.lab_paths("rr")
    backing = [paths.dir / "pool-0.raw", paths.dir / "pool-1.raw"]
    record = emulated_rack.LabRecord("rr", 1, 512 * MIB, 1024, "tcg", {"version": "6.12.1-amd64"}, str(initramfs_file),
                                     0.0, "/repo", "/venv", [emulated_rack.GuestRecord("lab-1", 1, pid=999999999)],
                                     profile="ram", devices=2, switch=True,
                                     backing=[str(b) for b in backing])  # fmt: skip
    g = paths.guest("lab-1")
    for sub in ("req", "out", "cancel", "share"):
        (g.spool / sub).mkdir(parents=True)
    for b in backing:
        b.write_bytes(b"shared")
    paths.state_file.write_text(json.dumps(record.to_dict()))
    spawned = []

    def spawn(argv, guest):
        spawned.append(argv)
        (guest.spool / "ready").write_text(json.dumps({"hostname": guest.name, "uptime_s": 5.0}))
        return 4242

    monkeypatch.setattr(emulated_rack, "_spawn", spawn)
    monkeypatch.setattr(emulated_rack, "_is_ours", lambda pid, guest: pid == 4242)
    assert emulated_rack.restart("rr", "lab-1").pid == 4242
    (argv,) = spawned
    assert argv[:3] == [str(tree / "usr/bin/qemu-system-x86_64"), "-L", str(stack.firmware)]
    joined = " ".join(argv)
    assert all(f"mem-path={b},size={256 * MIB}" in joined for b in backing) and "cxl-upstream" in joined
    assert "lsa" not in joined
    backing[1].unlink()
    (g.spool / "ready").unlink()
    monkeypatch.setattr(emulated_rack, "_is_ours", lambda pid, guest: False)
    with pytest.raises(EnvironmentProblem, match="pool file"):
        emulated_rack.restart("rr", "lab-1")
