"""The QEMU command line for one lab guest: q35 plus the CXL devices of its profile.

Profile `pmem` (QEMU 7.2, one persistent type-3 device) is built here; profile `ram` (QEMU 10,
volatile devices, optionally behind a switch) takes its CXL part from `belugactl.lab.topology`.

The topology is the one recorded in shared/reference/qemu-cxl-lab.md: one pxb-cxl host bridge with
TWO cxl-rp root ports. With a single root port QEMU 7.2 silently drops every data write to the
region (it does not emulate the pass-through host-bridge decoder), which `lab selftest` would catch.

Every guest's QEMU listens for QMP (its machine protocol) on `qmp.sock` in the guest's directory
(`qmp_socket`; lab/qmp.py speaks it): tests inject device errors through it. QEMU 10 (profile ram)
has the CXL error injection commands (`cxl-inject-poison`, ...); Debian 12's QEMU 7.2 (profile pmem)
has none of them (its QMP answers CommandNotFound).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from belugactl.lab.initramfs import HOSTROOT_TAG, REPO_TAG, SPOOL_TAG
from belugactl.lab.topology import RamTopology, cxl_args

LSA_SIZE = 2 * 1024 * 1024
# The CXL fixed memory window (CFMWS): room for the pool, whatever its size within reason.
WINDOW_SIZE = "4G"
ACCELS = ("tcg", "kvm")
PROFILES = ("pmem", "ram")


@dataclass(frozen=True)
class GuestSpec:
    name: str  # lab-1
    index: int  # 1-based
    kernel: Path
    initramfs: Path
    pool: Path
    pool_size: int
    lsa: Path
    spool: Path
    console: Path
    memory_mib: int = 1024
    accel: str = "tcg"
    host_root: str = "/"
    repo: Path | None = None  # exported again, uncached, over the cached host root
    # 2 always, except to prove that `lab selftest` catches QEMU 7.2 dropping writes behind one port.
    root_ports: int = 2
    # With a port: a user-mode network whose only way in is 127.0.0.1:ssh_port -> the guest's port 22.
    ssh_port: int | None = None
    # Host services the guest reaches at HOST_ALIAS:PORT (QEMU connects to 127.0.0.1:PORT for it): the
    # lab's etcd, for a metadata-server election between guests. Nothing else leaves the guest.
    host_ports: tuple[int, ...] = ()
    profile: str = "pmem"
    # Profile ram: the volatile devices (their files are shared by every guest; `pool`/`lsa` are unused)
    # and QEMU's -L folder holding firmware new enough for QEMU 10.
    ram: RamTopology | None = None
    firmware: Path | None = None


def _opt(path: Path | str) -> str:
    """A path inside a QEMU option string, where a comma separates options unless doubled."""
    return str(path).replace(",", ",,")


def kernel_cmdline(spec: GuestSpec) -> str:
    # panic=-1 with -no-reboot: a guest that panics makes QEMU exit, which `lab status` reports.
    return "console=ttyS0 loglevel=4 panic=-1 rdinit=/init mitigations=off"


QEMU = "qemu-system-x86_64"
QMP_SOCKET = "qmp.sock"
# sockaddr_un holds 108 bytes with the NUL: a longer path gets no monitor (QEMU would refuse to start).
_UNIX_PATH_MAX = 107


def qmp_socket(spec: GuestSpec) -> Path | None:
    """Where the guest's QEMU listens for QMP: `qmp.sock` beside its console (the guest's directory),
    None when that path is too long for a unix socket."""
    path = spec.console.parent / QMP_SOCKET
    return path if len(os.fsencode(path)) <= _UNIX_PATH_MAX else None


def qmp_args(spec: GuestSpec) -> list[str]:
    path = qmp_socket(spec)
    return [] if path is None else ["-qmp", f"unix:{_opt(path)},server=on,wait=off"]


def argv(spec: GuestSpec, qemu: str = QEMU) -> list[str]:
    if spec.accel not in ACCELS:
        raise ValueError(f"accel must be one of {ACCELS}")
    if spec.profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}")
    if spec.profile == "ram" and spec.ram is None:
        raise ValueError("profile ram needs its topology (spec.ram)")
    mem = f"{spec.memory_mib}M"
    # Kernel 6.12 will not commit a region when the CPU reports a hypervisor it cannot ask to flush
    # caches ("Failed to synchronize CPU cache state"): hide that CPUID bit from ram-profile guests.
    cpu = "max,hypervisor=off" if spec.profile == "ram" else "max"
    accel = ["-accel", "tcg,thread=multi", "-cpu", cpu] if spec.accel == "tcg" else ["-accel", "kvm", "-cpu", "host"]
    firmware = ["-L", str(spec.firmware)] if spec.firmware is not None else []
    repo = [] if spec.repo is None else [
        "-fsdev", f"local,id=repo,path={_opt(spec.repo)},security_model=none,readonly=on,multidevs=remap",
        "-device", f"virtio-9p-pci,fsdev=repo,mount_tag={REPO_TAG}",
    ]  # fmt: skip
    return [
        qemu,
        *firmware,
        "-name", f"{spec.name},process=belugactl-{spec.name}",
        "-machine", "q35,cxl=on",
        *accel,
        "-smp", "1",
        "-m", f"{mem},maxmem=8G,slots=4",
        # An explicit NUMA node gives the guest an SRAT, so the kernel adds a CPU-less node for the
        # CXL window (it only does so when SRAT parsing succeeded).
        "-object", f"memory-backend-ram,id=ram0,size={mem}",
        "-numa", "node,nodeid=0,cpus=0,memdev=ram0",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-chardev", f"file,id=console,path={_opt(spec.console)}",
        "-serial", "chardev:console",
        "-kernel", str(spec.kernel),
        "-initrd", str(spec.initramfs),
        "-append", kernel_cmdline(spec),
        "-fsdev", f"local,id=hostroot,path={_opt(spec.host_root)},security_model=none,readonly=on,multidevs=remap",
        "-device", f"virtio-9p-pci,fsdev=hostroot,mount_tag={HOSTROOT_TAG}",
        "-fsdev", f"local,id=spool,path={_opt(spec.spool)},security_model=none,multidevs=remap",
        "-device", f"virtio-9p-pci,fsdev=spool,mount_tag={SPOOL_TAG}",
        *repo,
        *network(spec),
        *qmp_args(spec),
        *(pmem_cxl_args(spec) if spec.profile == "pmem" else cxl_args(spec.ram)),  # type: ignore[arg-type]
    ]  # fmt: skip


def pmem_cxl_args(spec: GuestSpec) -> list[str]:
    return [
        "-object", f"memory-backend-file,id=cxl-mem1,share=on,mem-path={_opt(spec.pool)},size={spec.pool_size}",
        "-object", f"memory-backend-file,id=cxl-lsa1,share=on,mem-path={_opt(spec.lsa)},size={LSA_SIZE}",
        "-device", "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1",
        "-device", "cxl-rp,port=0,bus=cxl.1,id=rp0,chassis=0,slot=2",
        *(["-device", "cxl-rp,port=1,bus=cxl.1,id=rp1,chassis=0,slot=3"] if spec.root_ports > 1 else []),
        "-device", f"cxl-type3,bus=rp0,memdev=cxl-mem1,lsa=cxl-lsa1,id=cxl-pmem0,sn={spec.index}",
        "-M", f"cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size={WINDOW_SIZE}",
    ]  # fmt: skip


# The address a guest dials for a forwarded host service (lab up --host-port): inside slirp's
# 10.0.2.0/24, not the gateway (restrict=on drops everything to the gateway but these forwards).
HOST_ALIAS = "10.0.2.100"


def network(spec: GuestSpec) -> list[str]:
    """slirp with restrict=on (the guest reaches nothing outside): the ssh forward in, bound to loopback
    only, and each asked-for host service out. A guestfwd to a `tcp:` chardev would be one connection
    opened when QEMU starts; `cmd:` runs lab/host_forward.py per connection instead (libslirp splits
    the words with glib's shell-style parser and runs no shell; each word is quoted for it)."""
    if spec.ssh_port is None and not spec.host_ports:
        return []
    opts = ["user", "id=net0", "restrict=on"]
    if spec.ssh_port is not None:
        opts.append(f"hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22")
    helper = Path(__file__).with_name("host_forward.py").resolve()
    for port in spec.host_ports:
        words = [os.path.realpath(sys.executable), "-I", "-S", str(helper), str(int(port))]
        opts.append(f"guestfwd=tcp:{HOST_ALIAS}:{int(port)}-cmd:" + _opt(" ".join(shlex.quote(w) for w in words)))
    return ["-netdev", ",".join(opts), "-device", "virtio-net-pci,netdev=net0"]


def is_guest_process(cmdline: list[str] | None, guest_dir: Path) -> bool:
    """True when `cmdline` is a QEMU that belongs to the guest living in `guest_dir`.

    Pid files can outlive their process and pids get reused: before signalling a pid, make sure it
    still is our QEMU (its console file sits in the guest's directory).
    """
    if not cmdline or not os.path.basename(cmdline[0]).startswith("qemu-system"):
        return False
    marker = f"path={_opt(guest_dir)}{os.sep}"
    return any(marker in arg for arg in cmdline)
