"""The ram profile's software: QEMU 10, seabios, kernel 6.12 and cxl/ndctl/daxctl 81, from Debian packages.

Debian 12's own QEMU 7.2 can only emulate persistent CXL memory. The newer stack recorded in
shared/reference/qemu-cxl-lab-v2.md comes from two other Debian suites: QEMU from bookworm-backports
(built against Debian 12's libraries, so the binary runs here as is) and everything else from trixie.
Nothing is installed: apt is pointed at a private sources list, package lists and archive cache under
the lab cache (`-o Dir::...`), `apt-get download` fetches the .debs and `dpkg -x` unpacks them all into
one tree. The host's apt state and its own QEMU are never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem
from belugactl.lab import proc
from belugactl.lab.kernel import GuestKernel

MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
BACKPORTS = "bookworm-backports"
TRIXIE = "trixie"
SUITES = (BACKPORTS, TRIXIE)

# QEMU from backports: trixie's build needs a newer glibc than this Debian 12 host has.
QEMU_PACKAGES = ("qemu-system-x86", "qemu-system-common", "qemu-system-data")
# The rest from trixie. seabios >= 1.16.3 (bookworm's 1.16.2 is too old for QEMU 10); the tools need
# glibc >= 2.38, so trixie's libc6 and loader travel into the guest with the libraries they use.
TRIXIE_PACKAGES = (
    "seabios", "cxl", "ndctl", "daxctl", "libcxl1", "libndctl6", "libdaxctl1", "libc6",
    "libiniparser4", "libjson-c5", "libkeyutils1", "libuuid1", "libtraceevent1", "libtracefs1",
    "libkmod2", "libudev1", "libzstd1", "liblzma5", "libssl3t64", "libcap2", "zlib1g",
)  # fmt: skip
KERNEL_META = "linux-image-amd64"
KERNEL_PACKAGE_ENV = "BELUGACTL_LAB_RAM_KERNEL_PACKAGE"
_STAMP = "belugactl-ram-stack.json"
BIOS = "bios-256k.bin"
_DEPENDS_RE = re.compile(r"^Depends:\s*(linux-image-[^\s,(]+)", re.MULTILINE)
_DEB_RE = re.compile(r"^(?P<name>[^_]+)_(?P<version>[^_]+)_(?P<arch>[^_.]+)\.deb$")

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def stack_dir(cache: Path) -> Path:
    return cache / "ram"


@dataclass(frozen=True)
class Fetched:
    package: str
    version: str
    suite: str
    size: int  # bytes of the .deb


@dataclass(frozen=True)
class RamStack:
    """The unpacked tree and where its parts are inside it."""

    root: Path  # cache/ram
    kernel_version: str
    kernel_package: str
    packages: tuple[Fetched, ...]

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def qemu(self) -> Path:
        return self.tree / "usr" / "bin" / "qemu-system-x86_64"

    @property
    def firmware(self) -> Path:
        """QEMU's -L folder: share/qemu with its links into seabios resolved inside the tree."""
        return self.root / "firmware"

    @property
    def libdir(self) -> Path:
        return self.tree / "usr" / "lib" / "x86_64-linux-gnu"

    @property
    def loader(self) -> Path:
        return self.libdir / "ld-linux-x86-64.so.2"

    def tool(self, name: str) -> Path:
        return self.tree / "usr" / "bin" / name

    @property
    def kernel(self) -> GuestKernel:
        return GuestKernel(self.kernel_version, self.kernel_package, self.tree)

    def tree_size(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.tree):
            for f in files:
                p = os.path.join(dirpath, f)
                if not os.path.islink(p):
                    total += os.path.getsize(p)
        return total

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "qemu": str(self.qemu),
            "firmware": str(self.firmware),
            "kernel": {"version": self.kernel_version, "package": self.kernel_package},
            "packages": [
                {"package": p.package, "version": p.version, "suite": p.suite, "size": p.size} for p in self.packages
            ],
            "download_bytes": sum(p.size for p in self.packages),
        }


def apt_options(apt_dir: Path) -> list[str]:
    """apt options that keep every file apt reads or writes under `apt_dir`, never the host's."""
    opts = [
        f"Dir::Etc::SourceList={apt_dir / 'sources.list'}",
        "Dir::Etc::SourceParts=/dev/null",
        f"Dir::Etc::Preferences={apt_dir / 'preferences'}",
        "Dir::Etc::PreferencesParts=/dev/null",
        f"Dir::State::Lists={apt_dir / 'lists'}",
        f"Dir::State::status={apt_dir / 'status'}",
        f"Dir::State::extended_states={apt_dir / 'extended_states'}",
        f"Dir::Cache={apt_dir / 'cache'}",
        "APT::Get::List-Cleanup=0",
    ]
    if os.geteuid() == 0:
        # apt drops to the _apt user for downloads, who cannot enter a cache under /root.
        opts.append("APT::Sandbox::User=root")
    return [arg for opt in opts for arg in ("-o", opt)]


def sources_list(mirror: str = MIRROR, keyring: str = KEYRING) -> str:
    return "".join(f"deb [signed-by={keyring}] {mirror} {suite} main\n" for suite in SUITES)


def _init_apt_dir(apt_dir: Path) -> None:
    for d in (apt_dir / "lists" / "partial", apt_dir / "cache" / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    (apt_dir / "sources.list").write_text(sources_list())
    (apt_dir / "preferences").write_text("")
    (apt_dir / "status").touch()


def _apt(tool: str, apt_dir: Path, *args: str, cwd: Path | None = None, timeout: float = 600.0):
    return proc.run([tool, *apt_options(apt_dir), *args], cwd=cwd, timeout=timeout)


def parse_kernel_depends(show_output: str) -> str | None:
    """The versioned image package named by `apt-cache show linux-image-amd64/SUITE`."""
    match = _DEPENDS_RE.search(show_output)
    return match.group(1) if match else None


def parse_deb_name(filename: str) -> tuple[str, str] | None:
    """(package, version) from an `apt-get download` file name (version's ':' is written %3a)."""
    match = _DEB_RE.match(filename)
    if not match:
        return None
    return match.group("name"), match.group("version").replace("%3a", ":")


def package_plan(kernel_package: str) -> list[tuple[str, str]]:
    """(package, suite) for everything the ram profile needs."""
    return [(p, BACKPORTS) for p in QEMU_PACKAGES] + [(p, TRIXIE) for p in (*TRIXIE_PACKAGES, kernel_package)]


def load(cache: Path) -> RamStack | None:
    root = stack_dir(cache)
    try:
        data = json.loads((root / "tree" / _STAMP).read_text())
        stack = RamStack(
            root,
            str(data["kernel_version"]),
            str(data["kernel_package"]),
            tuple(Fetched(**p) for p in data["packages"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (stack.qemu.is_file() and stack.kernel.vmlinuz.is_file() and (stack.firmware / BIOS).is_file()):
        return None
    return stack


def _resolve_kernel(apt_dir: Path) -> str:
    override = os.environ.get(KERNEL_PACKAGE_ENV)
    if override:
        return override
    shown = _apt("apt-cache", apt_dir, "show", "--no-all-versions", f"{KERNEL_META}/{TRIXIE}", timeout=120)
    image = parse_kernel_depends(shown.stdout) if shown.ok else None
    if image is None:
        raise EnvironmentProblem(
            f"cannot tell which kernel {KERNEL_META} in {TRIXIE} points to",
            why=shown.describe(),
            fix=f"set {KERNEL_PACKAGE_ENV}=linux-image-6.12.<N>+deb13-amd64-unsigned",
        )
    # The unsigned image holds the same kernel without the Secure Boot signature (QEMU boots it directly).
    unsigned = f"{image}-unsigned"
    probe = _apt("apt-cache", apt_dir, "show", "--no-all-versions", f"{unsigned}/{TRIXIE}", timeout=120)
    return unsigned if probe.ok and "Package:" in probe.stdout else image


def _kernel_version(package: str) -> str:
    match = re.match(r"^linux-image-(\d\S*?)(-unsigned)?$", package)
    if not match:
        raise EnvironmentProblem(f"`{package}` does not look like a Debian kernel image package")
    return match.group(1)


def _build_firmware(tree: Path, out: Path) -> None:
    """share/qemu plus trixie's seabios images in one folder, links resolved inside `tree`.

    QEMU looks for bios-256k.bin in its built-in data folders, which would be the host's older seabios
    (too old for QEMU 10); `-L` this folder and it finds the newer one first.
    """
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for src in (tree / "usr" / "share" / "qemu", tree / "usr" / "share" / "seabios"):
        _copy_resolved(tree, src, out)


def _copy_resolved(tree: Path, src: Path, out: Path) -> None:
    for entry in sorted(src.rglob("*")):
        rel = entry.relative_to(src)
        target = out / rel
        if entry.is_dir() and not entry.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
            continue
        real = entry
        for _ in range(8):  # follow links one hop at a time, re-rooted in the tree
            if not real.is_symlink():
                break
            link = os.readlink(real)
            real = tree / link.lstrip("/") if link.startswith("/") else real.parent / link
        if real.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, target)


def prepare(cache: Path, *, refresh: bool = False, progress: Progress = _quiet) -> RamStack:
    """Fetch and unpack the ram profile's packages into cache/ram, unless already there."""
    if not refresh:
        existing = load(cache)
        if existing is not None:
            return existing
    root = stack_dir(cache)
    apt_dir = root / "apt"
    _init_apt_dir(apt_dir)
    progress(f"reading the {' and '.join(SUITES)} package lists into {apt_dir} (private apt state)")
    updated = _apt("apt-get", apt_dir, "-q", "update", timeout=900)
    if not updated.ok:
        raise EnvironmentProblem(
            f"apt could not read the {' / '.join(SUITES)} package lists from {MIRROR}",
            why=updated.describe(),
            fix="check network access to deb.debian.org, or use --profile pmem (Debian 12's own QEMU)",
        )
    kernel_package = _resolve_kernel(apt_dir)
    plan = package_plan(kernel_package)
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {len(plan)} packages into {debs}")
    fetched = _apt("apt-get", apt_dir, "-q", "download", *[f"{p}/{s}" for p, s in plan], cwd=debs, timeout=3600)
    if not fetched.ok:
        raise EnvironmentProblem(
            "could not download the ram profile's Debian packages",
            why=fetched.describe(),
            fix="check network access to deb.debian.org and run `belugactl lab prepare --profile ram` again",
        )
    suites = dict(plan)
    found: list[Fetched] = []
    files: dict[str, Path] = {}
    for deb in sorted(debs.glob("*.deb")):
        parsed = parse_deb_name(deb.name)
        if parsed and parsed[0] in suites:
            # An older download of the same package may sit next to the new one: keep the newest file.
            if parsed[0] in files and files[parsed[0]].stat().st_mtime > deb.stat().st_mtime:
                continue
            files[parsed[0]] = deb
            found = [f for f in found if f.package != parsed[0]]
            found.append(Fetched(parsed[0], parsed[1], suites[parsed[0]], deb.stat().st_size))
    missing = [p for p, _ in plan if p not in files]
    if missing:
        raise EnvironmentProblem(f"apt-get download did not bring {', '.join(missing)}", why=fetched.describe())
    # Unpack next to the target and swap at the end, so an interrupted run leaves no half tree.
    work = Path(tempfile.mkdtemp(prefix=".tree.", dir=root))
    try:
        tree = work / "tree"
        progress(f"unpacking {len(files)} packages (dpkg -x)")
        for name in sorted(files):
            unpacked = proc.run(["dpkg", "-x", str(files[name]), str(tree)], timeout=600)
            if not unpacked.ok:
                raise EnvironmentProblem(f"could not unpack {files[name].name}", why=unpacked.describe())
        version = _kernel_version(kernel_package)
        # Kernel 6.12 ships its modules under usr/lib/modules; depmod -b and modprobe look in lib/.
        if not (tree / "lib").exists():
            (tree / "lib").symlink_to("usr/lib")
        indexed = proc.run(["depmod", "-b", str(tree), version], timeout=600)
        if not indexed.ok:
            raise EnvironmentProblem(f"depmod failed for {version}", why=indexed.describe(), fix="install kmod")
        stamp = {
            "kernel_version": version,
            "kernel_package": kernel_package,
            "packages": [f.__dict__ for f in sorted(found, key=lambda f: f.package)],
        }
        (tree / _STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        _build_firmware(tree, work / "firmware")
        for part in ("tree", "firmware"):
            if (root / part).exists():
                shutil.rmtree(root / part)
            (work / part).rename(root / part)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stack = load(cache)
    if stack is None:
        raise EnvironmentProblem(f"the unpacked tree in {root} lacks QEMU, the kernel or the firmware")
    return stack
