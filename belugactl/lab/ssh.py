"""OpenSSH into lab guests: one forwarded port per guest, the host's own sshd running inside each.

`lab up --ssh` gives every guest a QEMU user-mode network (slirp: the guest is 10.0.2.15, the
host 10.0.2.2) whose only way in is a TCP forward from 127.0.0.1:PORT on this machine to the
guest's port 22. Nothing listens on any other host address. Inside the guest, /init brings eth0 up
and starts this machine's /usr/sbin/sshd (the guest's root *is* this machine's root, read-only
under an overlay) with a config, a host key and an authorized_keys file that `lab up` wrote into
the guest's spool. Every key and config lives in the lab's state directory, never in ~/.ssh, and
goes away with `lab down`.

The client side is a generated OpenSSH config (`<state>/ssh_config`, `belugactl lab ssh-config`)
whose Host aliases are the guest names, so `ssh -F <state>/ssh_config lab-1 -- belugactl --version`
and `belugactl rack ... --transport ssh --ssh-config <state>/ssh_config` work as on a real rack.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.lab.prereqs import find_program

# What QEMU's user-mode network gives the guest (fixed by slirp's defaults).
GUEST_ADDRESS = "10.0.2.15/24"
GATEWAY = "10.0.2.2"
# The only host address a forward may ever bind: the guests are reachable from this machine only.
FORWARD_BIND = "127.0.0.1"
# Loaded in the guest (with its dependencies, by modprobe in the chroot) when ssh is on.
NET_MODULES = ("virtio_net",)
SSHD = "/usr/sbin/sshd"
# Inside the guest the spool is mounted here (initramfs.GUEST_SPOOL); the sshd files sit below it.
GUEST_SSH_DIR = "ssh"
KEY_TYPE = "ed25519"


@dataclass(frozen=True)
class SshFiles:
    """The lab-wide ssh files, in `<state>/ssh/` (the client config also at `<state>/ssh_config`)."""

    dir: Path

    @property
    def client_key(self) -> Path:
        return self.dir / f"id_{KEY_TYPE}"

    @property
    def host_key(self) -> Path:
        return self.dir / f"ssh_host_{KEY_TYPE}_key"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"


def require() -> tuple[Path, Path]:
    """sshd (run inside the guests) and ssh-keygen, or an error naming the Debian packages."""
    keygen = find_program("ssh-keygen")
    sshd = Path(SSHD)
    missing = []
    if not (sshd.is_file() and os.access(sshd, os.X_OK)):
        missing.append(f"{SSHD} (Debian package openssh-server)")
    if keygen is None:
        missing.append("ssh-keygen (Debian package openssh-client)")
    if missing:
        raise EnvironmentProblem(
            "lab up --ssh needs " + " and ".join(missing),
            why="each guest runs this machine's own sshd; lab up makes the keys with ssh-keygen",
            fix="apt-get install -y openssh-server openssh-client (or drop --ssh and use lab exec)",
        )
    assert keygen is not None
    return sshd, keygen


def free_port(bind: str = FORWARD_BIND) -> int:
    """A TCP port free on `bind` right now (QEMU binds it moments later; a lost race fails the boot)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind, 0))
        return int(s.getsockname()[1])


def make_keys(files: SshFiles, lab: str, keygen: Path) -> None:
    """A client key for this lab and one host key that every guest of the lab presents."""
    files.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path, comment in ((files.client_key, f"belugactl-lab-{lab}"), (files.host_key, f"belugactl-lab-{lab}-host")):
        result = subprocess.run(  # noqa: S603 - argv list, no shell
            [str(keygen), "-q", "-t", KEY_TYPE, "-N", "", "-C", comment, "-f", str(path)],
            capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise StepFailed(f"ssh-keygen failed for {path}", why=result.stderr.strip() or f"exit {result.returncode}")


def sshd_config(guest_ssh_dir: str, env: Mapping[str, str]) -> str:
    """The guest's sshd_config: root by key only, files from the spool, PATH like `lab exec`."""
    setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
    return "\n".join([
        "# Written by belugactl lab up (belugactl/lab/ssh.py). Runs inside a lab guest only.",
        "Port 22",
        f"HostKey {guest_ssh_dir}/ssh_host_{KEY_TYPE}_key",
        f"AuthorizedKeysFile {guest_ssh_dir}/authorized_keys",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The keys sit on the host-owned 9p spool, not in a home the guest controls.
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "PidFile /run/sshd.pid",
        # Applied after sshd's default PATH, so this checkout's .venv/bin comes first, as in `lab exec`.
        f"SetEnv {setenv}",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
        "",
    ])


def install_guest(files: SshFiles, guest_spool: Path, guest_ssh_dir: str, env: Mapping[str, str]) -> None:
    """Put the host key, the authorized key and sshd_config where the guest's /init finds them."""
    d = guest_spool / GUEST_SSH_DIR
    d.mkdir(mode=0o700, exist_ok=True)
    key = d / files.host_key.name
    key.write_bytes(files.host_key.read_bytes())
    key.chmod(0o600)  # sshd refuses a private host key that others can read
    (d / "authorized_keys").write_text(files.client_key.with_suffix(".pub").read_text())
    (d / "sshd_config").write_text(sshd_config(guest_ssh_dir, env))


def known_hosts(files: SshFiles, ports: Mapping[str, int]) -> str:
    """Every guest presents the lab's host key on its forwarded port: pre-trusted, nothing to accept."""
    parts = files.host_key.with_suffix(".pub").read_text().split()
    return "".join(f"[{FORWARD_BIND}]:{port} {parts[0]} {parts[1]}\n" for port in ports.values())


def client_config(files: SshFiles, ports: Mapping[str, int]) -> str:
    """An OpenSSH client config whose Host aliases are the guest names."""
    blocks = [f"# belugactl lab: ssh -F {files.dir.parent / 'ssh_config'} {next(iter(ports), 'lab-1')}\n"]
    for name, port in ports.items():
        blocks.append(
            f"Host {name}\n"
            f"  HostName {FORWARD_BIND}\n"
            f"  Port {port}\n"
            "  User root\n"
            f"  IdentityFile {files.client_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {files.known_hosts}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  LogLevel ERROR\n"
        )
    return "\n".join(blocks)


def write_client_files(files: SshFiles, config_path: Path, ports: Mapping[str, int]) -> None:
    files.known_hosts.write_text(known_hosts(files, ports))
    config_path.write_text(client_config(files, ports))
