"""The guests' initramfs: static busybox, the few modules needed to reach the host's root, and /init.

/init mounts the host's root (read-only 9p) and the guest's spool (read-write 9p), sets the
hostname, mounts the guest's own /proc, /sys, /dev, /run over the host's and puts the guest
kernel's modules at /lib/modules, then chroots into the host root and runs the agent
(`belugactl.lab.guest.agent`) under the host's Python. The kernel is the guest's; every program is the
host's. Images are cached by content hash, so a rebuild happens only when an input changes.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import re
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem
from belugactl.lab import cpio, proc, ssh
from belugactl.lab.kernel import GuestKernel, module_paths
from belugactl.lab.prereqs import find_program

# Enough to reach the host's root over virtio 9p; everything else is loaded from the chroot by modprobe.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")

# Where the spool appears inside the chroot, and the 9p mount tags QEMU exports.
GUEST_SPOOL = "/run/belugactl-lab"
HOSTROOT_TAG = "hostroot"
SPOOL_TAG = "spool"
REPO_TAG = "repo"
# Profile ram: trixie's cxl/ndctl/daxctl 81 with their own glibc and loader, bound into the chroot here
# and run through wrappers (the host's glibc is too old for them; the host's Python stays on its own).
GUEST_TOOLS = "/opt/belugactl-cxl"
RAM_TOOLS = ("cxl", "ndctl", "daxctl")
LOADER = "ld-linux-x86-64.so.2"

INIT_SCRIPT = r"""#!/bin/sh
# belugactl lab guest init (PID 1). Written by belugactl.lab.initramfs; see that module for the why.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "belugactl-lab: $*"; }
die() { say "FATAL: $*"; poweroff -f; exit 1; }
say "init at $(cut -d' ' -f1 /proc/uptime) s"
for m in $(cat /etc/boot-modules); do insmod "/lib/modules/boot/$m" || die "insmod $m failed"; done
mkdir -p /lower /rw /host /spool
O=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$O" @SPOOL_TAG@ /spool || die "cannot mount the spool over 9p"
[ -r /spool/guest.env ] || die "no guest.env in the spool"
. /spool/guest.env
mount -t 9p -o "$O,ro,cache=${LAB_ROOT_CACHE:-none}" @HOSTROOT_TAG@ /lower \
  || die "cannot mount the host root over 9p"
hostname "$LAB_HOSTNAME"
# The host's root, read-only underneath a tmpfs: the guest may write anywhere (setup writes udev
# rules, sysctl files, ...) and every change stays in guest memory, never reaching the host.
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /host \
  || die "cannot mount the overlay root"
R=/host
# This checkout, uncached, so edits on the host show at once; its virtual environment stays on the
# cached root (it changes rarely and its imports are most of a Python start-up's 9p traffic).
if [ -n "$LAB_REPO" ]; then
  mkdir -p /repo
  mount -t 9p -o "$O,ro,cache=none" @REPO_TAG@ /repo || die "cannot mount the checkout over 9p"
  mount --bind /repo "$R$LAB_REPO" || die "cannot bind the checkout"
  case "$LAB_VENV" in "$LAB_REPO"/*) mount --bind "/lower$LAB_VENV" "$R$LAB_VENV" ;; esac
fi
mount -t proc proc $R/proc || die "cannot mount /proc in the chroot"
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
# The guest kernel's modules where modprobe looks for them.
mkdir -p "$R/lib/modules/$LAB_KERNEL_VERSION" || die "cannot create /lib/modules/$LAB_KERNEL_VERSION"
mount --bind "/lower$LAB_MODULES_DIR" "$R/lib/modules/$LAB_KERNEL_VERSION" || die "cannot bind the guest modules"
if [ -d @GUEST_TOOLS@ ]; then
  mkdir -p $R@GUEST_TOOLS@ && mount --bind @GUEST_TOOLS@ $R@GUEST_TOOLS@ || die "cannot bind the CXL tools"
fi
echo "$LAB_HOSTNAME" > $R/etc/hostname
# The host may be a container; the guest is not (only the overlay loses these, never the host).
rm -f $R/.dockerenv $R/run/.containerenv
mount -t tmpfs -o mode=0755 tmpfs $R/run
mkdir -p $R@GUEST_SPOOL@
mount --bind /spool $R@GUEST_SPOOL@
chroot $R /sbin/modprobe --ignore-install -a $LAB_MODULES || say "modprobe -a $LAB_MODULES failed"
# Loopback always: the metadata server's admin HTTP and TCP RPC listen on 127.0.0.1 by default.
ip link set lo up || say "loopback did not come up"
if [ -n "$LAB_NET" ] && [ -z "$LAB_SSH" ]; then
  # `lab up --host-port`: slirp's fixed addresses on eth0, to reach the forwarded host services.
  ip link set eth0 up && ip addr add @GUEST_ADDRESS@ dev eth0 && ip route add default via @GATEWAY@ \
    || say "eth0 did not come up: no host services"
fi
if [ -n "$LAB_SSH" ]; then
  # `lab up --ssh`: slirp's fixed addresses on eth0, then the host's own sshd in the chroot, configured
  # from the spool. QEMU forwards 127.0.0.1:PORT on the host to port 22 here; nothing else gets in.
  if ip link set eth0 up && ip addr add @GUEST_ADDRESS@ dev eth0 && ip route add default via @GATEWAY@; then
    mkdir -p $R/run/sshd && chmod 0755 $R/run/sshd
    # sshd runs `bash -c CMD`, and Debian's bash then sources ~/.bashrc even when not interactive;
    # the host's root .bashrc may rewrite PATH (and be slow). Skip it for ssh commands, in the guest only.
    RH=$(awk -F: '$1 == "root" { print $6; exit }' $R/etc/passwd)
    if [ -n "$RH" ] && [ -f "$R$RH/.bashrc" ]; then
      { echo 'case $- in *i*) ;; *) [ -n "$SSH_CONNECTION" ] && return ;; esac'; cat "$R$RH/.bashrc"; } > /tmp/bashrc
      cat /tmp/bashrc > "$R$RH/.bashrc"
    fi
    if chroot $R @SSHD@ -f @GUEST_SPOOL@/ssh/sshd_config -E @GUEST_SPOOL@/ssh/sshd.log; then
      say "sshd listening on port 22"
    else
      say "sshd failed to start (see the spool's ssh/sshd.log)"
    fi
  else
    say "eth0 did not come up: no ssh"
  fi
fi
say "user space ready at $(cut -d' ' -f1 /proc/uptime) s; starting the agent"
while :; do
  chroot $R /usr/bin/env -i PATH="$LAB_PATH" HOME=/root TMPDIR=/tmp LANG=C.UTF-8 \
    "$LAB_PYTHON" -I -S "$LAB_AGENT" --spool @GUEST_SPOOL@ --hostname "$LAB_HOSTNAME" \
    ${LAB_RESIDENT_PYTHON:+--resident-python "$LAB_RESIDENT_PYTHON"}
  say "agent exited with status $?; restarting"
  sleep 1
done
"""


@dataclass(frozen=True)
class Initramfs:
    path: Path
    size: int
    modules: tuple[str, ...]


def init_script() -> str:
    return (
        INIT_SCRIPT.replace("@HOSTROOT_TAG@", HOSTROOT_TAG)
        .replace("@SPOOL_TAG@", SPOOL_TAG)
        .replace("@REPO_TAG@", REPO_TAG)
        .replace("@GUEST_SPOOL@", GUEST_SPOOL)
        .replace("@GUEST_ADDRESS@", ssh.GUEST_ADDRESS)
        .replace("@GATEWAY@", ssh.GATEWAY)
        .replace("@SSHD@", ssh.SSHD)
        .replace("@GUEST_TOOLS@", GUEST_TOOLS)
    )


_LIST_RE = re.compile(r"=>\s*(/\S+)|^\s*(/\S+)\s+\(", re.MULTILINE)


def parse_loader_list(text: str) -> list[str]:
    """Library paths from `ld-linux-x86-64.so.2 --list` output; a missing library is an error."""
    missing = [line.split("=>")[0].strip() for line in text.splitlines() if "not found" in line]
    if missing:
        raise EnvironmentProblem(f"the guest tools need libraries that are not unpacked: {', '.join(missing)}",
                                 fix="belugactl lab prepare --profile ram --refresh")
    return [a or b for a, b in _LIST_RE.findall(text)]


@dataclass(frozen=True)
class RamTools:
    """cxl/ndctl/daxctl from an unpacked trixie tree: the binaries, their libraries, the loader."""

    bindir: Path
    libdir: Path  # where --library-path points: the tree's usr/lib/x86_64-linux-gnu
    tools: tuple[str, ...] = RAM_TOOLS

    def libraries(self) -> list[Path]:
        """Every library the tools load, resolved inside the tree (never the host's)."""
        loader = self.libdir / LOADER
        found: dict[str, Path] = {}
        for tool in self.tools:
            listed = proc.run([str(loader), "--list", "--library-path", str(self.libdir), str(self.bindir / tool)],
                              timeout=60)
            if not listed.ok:
                raise EnvironmentProblem(f"cannot resolve the libraries of {tool}", why=listed.describe())
            for path in parse_loader_list(listed.stdout):
                p = Path(path)
                found.setdefault(p.name, p)
        found[LOADER] = loader
        usr = self.libdir.resolve().parent.parent
        outside = [str(p) for p in found.values() if not p.resolve().is_relative_to(usr)]
        if outside:
            raise EnvironmentProblem(f"the guest tools resolved libraries outside the tree: {', '.join(outside)}",
                                     fix="add the Debian package that holds them to belugactl.lab.debstack")
        return sorted(found.values(), key=lambda p: p.name)


def wrapper(tool: str) -> str:
    """The script the chroot runs as `cxl` etc.: trixie's loader with trixie's libraries."""
    return (f"#!/bin/sh\nexec {GUEST_TOOLS}/lib/{LOADER} --library-path {GUEST_TOOLS}/lib "
            f"--argv0 {tool} {GUEST_TOOLS}/libexec/{tool} \"$@\"\n")


def tool_entries(tools: RamTools) -> list[cpio.Entry]:
    base = GUEST_TOOLS.lstrip("/")
    items = [cpio.directory(d) for d in ("opt", base, f"{base}/bin", f"{base}/lib", f"{base}/libexec")]
    for lib in tools.libraries():
        items.append(cpio.file(f"{base}/lib/{lib.name}", lib.resolve().read_bytes(), 0o755))
    for tool in tools.tools:
        items.append(cpio.file(f"{base}/libexec/{tool}", (tools.bindir / tool).read_bytes(), 0o755))
        items.append(cpio.file(f"{base}/bin/{tool}", wrapper(tool).encode(), 0o755))
    return items


def module_bytes(path: Path) -> tuple[str, bytes]:
    """A module's name and contents as busybox insmod needs them: .ko.xz decompressed (kernel 6.12)."""
    name = path.name
    if name.endswith(".ko.xz"):
        return name[: -len(".xz")], lzma.decompress(path.read_bytes())
    return name, path.read_bytes()


def entries(
    kernel: GuestKernel, busybox: Path, tools: RamTools | None = None
) -> tuple[list[cpio.Entry], tuple[str, ...]]:
    mods = module_paths(kernel.modules_dir, list(BOOT_MODULES))
    loaded = [module_bytes(kernel.modules_dir / m) for m in mods]
    names = tuple(name for name, _ in loaded)
    items = [
        cpio.directory(d)
        for d in ("bin", "dev", "etc", "proc", "sys", "lib", "lib/modules", "lib/modules/boot")
        + ("lower", "rw", "host", "spool", "repo", "tmp")
    ]
    items += [
        cpio.char_device("dev/console", 5, 1),
        cpio.char_device("dev/null", 1, 3, 0o666),
        cpio.file("bin/busybox", busybox.read_bytes(), 0o755),
        cpio.symlink("bin/sh", "busybox"),
        cpio.file("init", init_script().encode(), 0o755),
        cpio.file("etc/boot-modules", ("\n".join(names) + "\n").encode()),
    ]
    items += [cpio.file(f"lib/modules/boot/{name}", data) for name, data in loaded]
    if tools is not None:
        items += tool_entries(tools)
    return items, names


def build(
    kernel: GuestKernel, cache: Path, busybox: Path | None = None, tools: RamTools | None = None
) -> Initramfs:
    """Build (or reuse) the initramfs for `kernel`; the file name carries a hash of every input."""
    busybox = busybox or find_program("busybox")
    if busybox is None:
        raise EnvironmentProblem("busybox not found", fix="apt-get install -y busybox-static")
    items, names = entries(kernel, busybox.resolve(), tools)
    buf = io.BytesIO()
    cpio.write(buf, items)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    out_dir = cache / "initramfs"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kernel.version}-{digest}.cpio"
    if not path.is_file() or path.stat().st_size != len(data):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.rename(path)
        # Older images of this kernel are stale now; keep the cache from growing run after run.
        for old in out_dir.glob(f"{kernel.version}-*.cpio"):
            if old != path:
                old.unlink(missing_ok=True)
    return Initramfs(path, len(data), names)
