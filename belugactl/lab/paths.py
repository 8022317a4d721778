"""Where the lab keeps things: a cache shared by all labs, and one state directory per lab."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "BELUGACTL_CACHE"
STATE_ENV = "BELUGACTL_LAB_STATE"

# Guest names follow examples/lab.yaml: lab-1, lab-2, ...
GUEST_PREFIX = "lab-"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def cache_root(env: dict[str, str] | None = None) -> Path:
    """Downloaded kernels and built initramfs images, reused by every lab and every run."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "belugactl"


def state_root(env: dict[str, str] | None = None) -> Path:
    """The parent of every lab's runtime state (pool file, pid files, consoles, spools)."""
    env = os.environ if env is None else env
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    if os.geteuid() == 0:
        return Path("/run/belugactl/lab")
    return Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "belugactl" / "lab"


def valid_lab_name(name: str) -> bool:
    return bool(_NAME_RE.match(name))


def guest_name(index: int) -> str:
    """1-based, as in the manifest: lab-1 is the first guest."""
    return f"{GUEST_PREFIX}{index}"


@dataclass(frozen=True)
class LabPaths:
    """The files of one lab named `name` under `root`."""

    root: Path
    name: str

    @property
    def dir(self) -> Path:
        return self.root / self.name

    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    @property
    def pool(self) -> Path:
        return self.dir / "pool.raw"

    @property
    def lock(self) -> Path:
        return self.dir / ".lock"

    @property
    def ssh_dir(self) -> Path:
        """Keys and known_hosts of `lab up --ssh` (never ~/.ssh)."""
        return self.dir / "ssh"

    @property
    def ssh_config(self) -> Path:
        """The OpenSSH client config naming every guest: ssh -F THIS lab-1."""
        return self.dir / "ssh_config"

    def guest(self, name: str) -> GuestPaths:
        return GuestPaths(self.dir / "guests" / name, name)


@dataclass(frozen=True)
class GuestPaths:
    dir: Path
    name: str

    @property
    def pidfile(self) -> Path:
        return self.dir / "qemu.pid"

    @property
    def lsa(self) -> Path:
        return self.dir / "lsa.raw"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.dir / "qemu.log"

    @property
    def spool(self) -> Path:
        """Exported read-write to the guest; the exec channel lives here."""
        return self.dir / "spool"

    @property
    def share(self) -> Path:
        """A scratch folder both sides can write: /run/belugactl-lab/share inside the guest."""
        return self.spool / "share"
