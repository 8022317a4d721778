"""The guests' kernel: a Debian kernel image package, downloaded, unpacked and depmod-ed into the cache.

Nothing is installed over this machine's own kernel: `apt-get download` fetches the .deb, `dpkg -x`
unpacks it into the cache, `depmod -b` indexes its modules there.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem
from belugactl.lab import proc

META_PREFIX = "linux-image-amd64"
KERNEL_PACKAGE_ENV = "BELUGACTL_LAB_KERNEL_PACKAGE"
_STAMP = "belugactl-kernel.json"
_PKG_RE = re.compile(r"^\s*Depends:\s*(linux-image-\S+)\s*$", re.MULTILINE)
_VERSION_RE = re.compile(r"^linux-image-(\d.*)$")


@dataclass(frozen=True)
class GuestKernel:
    version: str  # e.g. 6.1.0-57-amd64
    package: str  # e.g. linux-image-6.1.0-57-amd64
    root: Path  # the unpacked tree: boot/, lib/modules/<version>/

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def vmlinux(self) -> Path:
        """The uncompressed ELF kernel, extracted from vmlinuz (see `boot_image`)."""
        return self.root / "boot" / f"vmlinux-{self.version}"

    @property
    def config(self) -> Path:
        return self.root / "boot" / f"config-{self.version}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.version

    def to_dict(self) -> dict[str, str]:
        return {"version": self.version, "package": self.package, "vmlinuz": str(self.vmlinuz)}


def kernels_dir(cache: Path) -> Path:
    return cache / "kernels"


def cached(cache: Path) -> list[GuestKernel]:
    """Kernels already prepared in the cache, newest version first."""
    found: list[GuestKernel] = []
    base = kernels_dir(cache)
    if not base.is_dir():
        return found
    for entry in base.iterdir():
        stamp = entry / _STAMP
        if not stamp.is_file():
            continue  # an interrupted unpack; prepare() replaces it
        try:
            data = json.loads(stamp.read_text())
            kernel = GuestKernel(str(data["version"]), str(data["package"]), entry)
        except (OSError, ValueError, KeyError):
            continue
        if kernel.vmlinuz.is_file() and (kernel.modules_dir / "modules.dep").is_file():
            found.append(kernel)
    return sorted(found, key=lambda k: _version_key(k.version), reverse=True)


def _version_key(version: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.-]", version))


def version_of_package(package: str) -> str:
    match = _VERSION_RE.match(package)
    if not match:
        raise EnvironmentProblem(
            f"`{package}` does not look like a Debian kernel image package",
            fix=f"set {KERNEL_PACKAGE_ENV} to a name like linux-image-6.1.0-57-amd64",
        )
    return match.group(1)


def resolve_package() -> str:
    """The kernel package that Debian's linux-image-amd64 currently points to (or the override)."""
    override = os.environ.get(KERNEL_PACKAGE_ENV)
    if override:
        return override
    result = proc.run(["apt-cache", "depends", META_PREFIX], timeout=120)
    match = _PKG_RE.search(result.stdout) if result.ok else None
    if not match and os.geteuid() == 0:
        # A fresh image often has no package lists yet; as root, fetch them once and ask again.
        proc.run(["apt-get", "update", "-q"], timeout=600)
        result = proc.run(["apt-cache", "depends", META_PREFIX], timeout=120)
        match = _PKG_RE.search(result.stdout) if result.ok else None
    if not match:
        raise EnvironmentProblem(
            f"cannot tell which kernel package {META_PREFIX} depends on",
            why=result.describe(),
            fix=f"apt-get update, or set {KERNEL_PACKAGE_ENV}=linux-image-<version>-amd64",
        )
    return match.group(1)


def find(cache: Path) -> GuestKernel | None:
    """The kernel `lab up` uses: the override if set and cached, else the newest cached one."""
    kernels = cached(cache)
    override = os.environ.get(KERNEL_PACKAGE_ENV)
    if override:
        kernels = [k for k in kernels if k.package == override]
    return kernels[0] if kernels else None


def prepare(cache: Path, *, refresh: bool = False) -> GuestKernel:
    """Download, unpack and depmod the guest kernel, unless the cache already has it."""
    if not refresh:
        existing = find(cache)
        if existing is not None:
            return existing
    package = resolve_package()
    version = version_of_package(package)
    target = kernels_dir(cache) / version
    for kernel in cached(cache):
        if kernel.package == package and not refresh:
            return kernel
    kernels_dir(cache).mkdir(parents=True, exist_ok=True)
    # Unpack next to the target and rename at the end, so an interrupted run leaves no half kernel.
    work = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=kernels_dir(cache)))
    try:
        fetched = proc.run(["apt-get", "download", package], cwd=work, timeout=1800)
        debs = sorted(work.glob("*.deb"))
        if not fetched.ok or not debs:
            raise EnvironmentProblem(
                f"could not download {package}",
                why=fetched.describe(),
                fix="check network access to the Debian mirror and run `apt-get update`",
            )
        tree = work / "tree"
        unpacked = proc.run(["dpkg", "-x", str(debs[0]), str(tree)], timeout=600)
        if not unpacked.ok:
            raise EnvironmentProblem(f"could not unpack {debs[0].name}", why=unpacked.describe())
        indexed = proc.run(["depmod", "-b", str(tree), version], timeout=600)
        if not indexed.ok:
            raise EnvironmentProblem(f"depmod failed for {version}", why=indexed.describe(), fix="install kmod")
        (tree / _STAMP).write_text(json.dumps({"version": version, "package": package}) + "\n")
        if target.exists() and (refresh or not (target / _STAMP).is_file()):
            shutil.rmtree(target)
        try:
            tree.rename(target)
        except OSError:
            # Another `prepare` finished the same kernel first (labs may be brought up side by side);
            # keep its copy, which a running lab may already use.
            if not (target / _STAMP).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kernel = GuestKernel(version, package, target)
    if not kernel.vmlinuz.is_file():
        raise EnvironmentProblem(f"{package} holds no {kernel.vmlinuz.name}")
    return kernel


def config_value(kernel: GuestKernel, option: str) -> str | None:
    """CONFIG_X's value from the kernel's config (`y`, `m`, a number), or None when unset."""
    try:
        text = kernel.config.read_text()
    except OSError:
        return None
    match = re.search(rf"^{re.escape(option)}=(.*)$", text, re.MULTILINE)
    return match.group(1) if match else None


def module_paths(modules_dir: Path, names: list[str]) -> list[str]:
    """Module files (relative to modules_dir) for `names` and all their dependencies, in load order.

    Built-in modules need nothing and are skipped; an unknown name is an error.
    """
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    builtin = set()
    builtin_file = modules_dir / "modules.builtin"
    if builtin_file.is_file():
        builtin = {_module_name(p) for p in builtin_file.read_text().split()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(path: str) -> None:
        if path in seen:
            return
        seen.add(path)
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in names:
        key = name.replace("-", "_")
        if key in by_name:
            visit(by_name[key])
        elif key not in builtin:
            raise EnvironmentProblem(f"the guest kernel has no module {name}")
    return order


def _module_name(path: str) -> str:
    base = os.path.basename(path)
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZIP_MAGIC = b"\x1f\x8b\x08"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _complete_elf(data: bytes) -> bool:
    """A 64-bit ELF whose section header table lies inside the data (so nothing was cut off)."""
    if len(data) < 64 or not data.startswith(b"\x7fELF") or data[4] != 2:
        return False
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return shoff + shentsize * shnum <= len(data)


def _unzstd(payload: bytes) -> bytes | None:
    """Decompress a zstd payload with the zstd program (Python 3.11 has no zstd module).

    The bzImage's payload is followed by other bytes, so zstd exits 1 after writing the whole frame;
    the output is trusted only when it is a complete ELF.
    """
    zstd = shutil.which("zstd")
    if zstd is None:
        return None
    try:
        out = subprocess.run([zstd, "-dc"], input=payload, capture_output=True, timeout=120, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out if _complete_elf(out) else None


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF kernel inside a bzImage (xz or gzip payload; zstd with the zstd program), or None."""
    start = bzimage.find(_ZSTD_MAGIC)
    if start != -1 and (data := _unzstd(bzimage[start:])) is not None:
        return data
    for magic, open_stream in ((_XZ_MAGIC, "xz"), (_GZIP_MAGIC, "gzip")):
        start = bzimage.find(magic)
        while start != -1:
            try:
                if open_stream == "xz":
                    data = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
                else:
                    data = gzip.GzipFile(fileobj=io.BytesIO(bzimage[start:])).read()
            except (lzma.LZMAError, OSError, EOFError):
                data = b""
            if data.startswith(b"\x7fELF"):
                return data
            start = bzimage.find(magic, start + 1)
    return None


def boot_image(kernel: GuestKernel) -> Path:
    """What QEMU's -kernel gets: the uncompressed ELF when the kernel supports PVH entry, else vmlinuz.

    Booting the ELF through its PVH entry point skips the firmware's real-mode setup and the
    kernel's self-decompression, which under TCG took 10 to 20 s of a 30 s boot on 2 cores.
    """
    if config_value(kernel, "CONFIG_PVH") != "y":
        return kernel.vmlinuz
    if kernel.vmlinux.is_file():
        return kernel.vmlinux
    data = extract_vmlinux(kernel.vmlinuz.read_bytes())
    if data is None:
        return kernel.vmlinuz
    tmp = kernel.vmlinux.with_name(f".{kernel.vmlinux.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, kernel.vmlinux)
    return kernel.vmlinux
