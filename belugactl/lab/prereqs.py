"""What the lab needs from this machine, which Debian package brings each piece, and installing them."""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem
from belugactl.host.command_runner import Runner

QEMU = "qemu-system-x86_64"


@dataclass(frozen=True)
class Requirement:
    program: str
    package: str
    why: str
    static: bool = False  # must be a statically linked binary (it runs inside the initramfs)


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(QEMU, "qemu-system-x86", "runs the guests"),
    Requirement("cxl", "ndctl", "creates CXL regions inside the guests"),
    Requirement("ndctl", "ndctl", "creates devdax namespaces inside the guests"),
    Requirement("daxctl", "daxctl", "lists and reconfigures dax devices inside the guests"),
    Requirement("busybox", "busybox-static", "the guests' initramfs shell", static=True),
    Requirement("depmod", "kmod", "indexes the guest kernel's modules"),
    Requirement("modprobe", "kmod", "loads modules inside the guests"),
    Requirement("dpkg", "dpkg", "unpacks the guest kernel package"),
    Requirement("apt-get", "apt", "downloads the guest kernel package"),
)

SEARCH_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class Missing:
    requirement: Requirement
    reason: str


def find_program(name: str) -> Path | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SEARCH_PATH])
    found = shutil.which(name, path=path)
    return Path(found) if found else None


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (PT_INTERP), i.e. statically linked."""
    try:
        with open(path, "rb") as fh:
            ident = fh.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2:  # 64-bit only
                return False
            endian = "<" if ident[5] == 1 else ">"
            phoff = struct.unpack_from(endian + "Q", ident, 32)[0]
            phentsize, phnum = struct.unpack_from(endian + "HH", ident, 54)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        (p_type,) = struct.unpack_from(endian + "I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def check() -> list[Missing]:
    missing: list[Missing] = []
    for req in REQUIREMENTS:
        path = find_program(req.program)
        if path is None:
            missing.append(Missing(req, f"`{req.program}` not found"))
        elif req.static and not is_static_elf(path.resolve()):
            missing.append(Missing(req, f"{path} is dynamically linked; the initramfs needs a static one"))
    return missing


def packages_for(missing: list[Missing]) -> list[str]:
    return sorted({m.requirement.package for m in missing})


def require() -> None:
    """Raise an EnvironmentProblem naming the exact packages to install."""
    missing = check()
    if not missing:
        return
    pkgs = packages_for(missing)
    raise EnvironmentProblem(
        f"the lab needs {len(pkgs)} Debian package{'s' if len(pkgs) != 1 else ''} that this machine lacks: "
        + ", ".join(pkgs),
        why="; ".join(f"{m.reason} ({m.requirement.why})" for m in missing),
        fix=f"apt-get install -y --no-install-recommends {' '.join(pkgs)}"
        "   (or, as root: belugactl lab prepare --install)",
    )


def install(runner: Runner) -> list[str]:
    """Install the missing packages with apt (root only); return what was installed."""
    missing = check()
    pkgs = packages_for(missing)
    if not pkgs:
        return []
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "installing the lab's packages needs root",
            why=f"missing: {', '.join(pkgs)}",
            fix=f"sudo apt-get install -y --no-install-recommends {' '.join(pkgs)}",
        )
    env_note = "DEBIAN_FRONTEND=noninteractive"
    update = runner.run(["apt-get", "update", "-q"], timeout=600)
    if not update.ok:
        raise EnvironmentProblem("apt-get update failed", why=update.describe(), fix="check the apt sources")
    result = runner.run(
        ["env", env_note, "apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs], timeout=1800
    )
    if not result.ok:
        raise EnvironmentProblem(
            "apt-get install failed", why=result.describe(), fix=f"apt-get install -y {' '.join(pkgs)}"
        )
    require()
    return pkgs
