"""Device permissions for `/dev/daxX.Y`: a udev rule (so they survive a reboot) and chown/chmod now.

Device nodes are recreated with default owner and mode at every boot and every rebind; only a udev
rule makes a choice stick. The names of users and groups are looked up in the host's own
/etc/passwd and /etc/group (under the Host root), so fixture trees work like machines.
"""

from __future__ import annotations

import os

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host

RULES_DIR = "/etc/udev/rules.d"
RULE_FILE = f"{RULES_DIR}/60-belugactl-dax.rules"


def rule_text(device: str, owner: str, group: str, mode: int) -> str:
    name = device.removeprefix("/dev/")
    return (
        "# Written by belugactl setup: permissions of the shared CXL pool's device-dax node.\n"
        "# Remove with `belugactl teardown`.\n"
        f'SUBSYSTEM=="dax", KERNEL=="{name}", OWNER="{owner}", GROUP="{group}", MODE="{mode:04o}"\n'
    )


def _lookup(host: Host, table: str, name: str) -> int | None:
    text = host.read_text(table)
    if text is None:
        return None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] == name:
            try:
                return int(fields[2])
            except ValueError:
                return None
    if name.isdigit():
        return int(name)
    return None


def lookup_uid(host: Host, owner: str) -> int | None:
    return _lookup(host, "/etc/passwd", owner)


def lookup_gid(host: Host, group: str) -> int | None:
    return _lookup(host, "/etc/group", group)


def write_config_file(host: Host, path: str, text: str, mode: int = 0o644) -> None:
    target = host.path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".belugactl-tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)  # atomic: udev never reads half a rule
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot write {path}: permission denied", fix="run as root") from exc


def remove_file(host: Host, path: str) -> None:
    try:
        host.path(path).unlink()
    except FileNotFoundError:
        return
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot remove {path}: permission denied", fix="run as root") from exc


def set_ownership(host: Host, path: str, owner: str, group: str, mode: int) -> None:
    uid = lookup_uid(host, owner)
    gid = lookup_gid(host, group)
    if uid is None or gid is None:
        missing = owner if uid is None else group
        raise EnvironmentProblem(
            f"no user or group named {missing!r} on this host",
            fix=f"create it first (`groupadd {group}` / `useradd {owner}`), or change permissions in the manifest",
        )
    target = host.path(path)
    try:
        os.chown(target, uid, gid)
        os.chmod(target, mode)
    except FileNotFoundError as exc:
        raise StepFailed(f"{path} does not exist", fix="check `daxctl list`; the dax device may be gone") from exc
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot chown/chmod {path}: permission denied", fix="run as root") from exc
