"""Device-dax: /sys/bus/dax devices, `daxctl list`, and the /dev/daxX.Y nodes' owner and mode.

Sysfs (reference cxl-tooling.md 3.2) gives size, align, target_node, numa_node, resource and the
bound driver (device_dax = devdax, kmem = system-ram); `daxctl list -R -D` adds the region id
and, for system-ram, the memory block counts. daxctl prints no numa_node, so that always comes
from sysfs. A captured or fixture tree cannot hold device nodes: their metadata lives in
`.belugactl/devnodes.json` instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from belugactl.host.host import Host
from belugactl.host.read_tools import as_bool, as_int, as_size, as_str, run_json
from belugactl.host.snapshot import DaxDevice

DAX_DEVICES = "/sys/bus/dax/devices"
DAXCTL_LIST = ("daxctl", "list", "-R", "-D")
# In a captured tree: {"/dev/dax0.0": {"mode": 384, "uid": 0, "gid": 0, "owner": "root", "group": "root"}}
DEVNODES_FILE = ".belugactl/devnodes.json"

_DRIVER_MODE = {"device_dax": "devdax", "kmem": "system-ram"}


@dataclass(frozen=True)
class DevNode:
    exists: bool
    mode: int | None = None  # permission bits
    uid: int | None = None
    gid: int | None = None
    owner: str | None = None
    group: str | None = None
    is_char: bool | None = None


def read_dax(host: Host, problems: list[str], devnames: dict[str, str] | None = None) -> list[DaxDevice]:
    """All dax devices; `devnames` (from udev) maps a device name to its /dev node when it is not /dev/<name>."""
    listed = {d.name: d for d in parse_daxctl_list(run_json(host, DAXCTL_LIST, problems) or [])}
    names = [n for n in host.listdir(DAX_DEVICES) if re.fullmatch(r"dax\d+\.\d+", n)]
    devnodes = _load_devnodes(host, problems)
    devices = []
    for name in sorted(set(names) | set(listed), key=_natural):
        merged = _from_sysfs(host, name) if name in names else DaxDevice(name=name)
        tool = listed.get(name)
        if tool is not None:
            # daxctl knows the mode and memory blocks; sysfs alone knows numa_node and resource.
            known = {f.name: getattr(tool, f.name) for f in dataclasses.fields(tool)}
            merged = dataclasses.replace(merged, **{k: v for k, v in known.items() if v is not None})
        dev_path = (devnames or {}).get(name, f"/dev/{name}")
        node = devnode(host, dev_path, devnodes)
        devices.append(
            dataclasses.replace(
                merged,
                dev_path=dev_path,
                dev_exists=node.exists,
                dev_uid=node.uid,
                dev_gid=node.gid,
                dev_mode=node.mode,
                dev_owner=node.owner,
                dev_group=node.group,
            )
        )
    return devices


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _node(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None


def _from_sysfs(host: Host, name: str) -> DaxDevice:
    base = f"{DAX_DEVICES}/{name}"
    driver = host.readlink(f"{base}/driver")
    driver_name = os.path.basename(driver) if driver else None
    real = host.resolve(base)
    region_id = host.read_int(f"{os.path.dirname(real)}/dax_region/id", 10) if real else None
    return DaxDevice(
        name=name,
        size=host.read_int(f"{base}/size"),
        align=host.read_int(f"{base}/align"),
        mode=_DRIVER_MODE.get(driver_name or ""),
        target_node=_node(host.read_int(f"{base}/target_node", 10)),
        numa_node=_node(host.read_int(f"{base}/numa_node", 10)),
        resource=host.read_int(f"{base}/resource"),
        region_id=region_id,
        driver=driver_name,
    )


def parse_daxctl_list(data: Iterable[Any]) -> list[DaxDevice]:
    """Devices in `daxctl list` output: a flat device array, or regions holding `devices`."""
    out: list[DaxDevice] = []
    for item in data:
        _walk(item, None, out)
    return out


def _walk(obj: Any, region_id: int | None, out: list[DaxDevice]) -> None:
    if isinstance(obj, list):
        for item in obj:
            _walk(item, region_id, out)
        return
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("chardev"), str):
        target = as_int(obj.get("target_node"))
        out.append(
            DaxDevice(
                name=obj["chardev"],
                size=as_size(obj.get("size")),
                align=as_size(obj.get("align")),
                mode=as_str(obj.get("mode")),
                target_node=target if target is not None and target >= 0 else None,
                region_id=region_id,
                online_memblocks=as_int(obj.get("online_memblocks")),
                total_memblocks=as_int(obj.get("total_memblocks")),
                movable=as_bool(obj.get("movable")),
                state=as_str(obj.get("state")),
            )
        )
        return
    if "devices" in obj:
        _walk(obj["devices"], as_int(obj.get("id")), out)


def _load_devnodes(host: Host, problems: list[str]) -> dict[str, Any] | None:
    if host.is_live:
        return None
    text = host.read_text(DEVNODES_FILE)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.append(f"{DEVNODES_FILE}: not JSON ({exc.msg})")
        return {}
    return data if isinstance(data, dict) else {}


def devnode(host: Host, path: str, recorded: dict[str, Any] | None) -> DevNode:
    """Owner and mode of a device node: stat on a live host, the recorded metadata in a tree."""
    if recorded is not None:
        entry = recorded.get(path)
        if not isinstance(entry, dict):
            return DevNode(exists=False)
        return DevNode(
            exists=True,
            mode=as_int(entry.get("mode")),
            uid=as_int(entry.get("uid")),
            gid=as_int(entry.get("gid")),
            owner=as_str(entry.get("owner")),
            group=as_str(entry.get("group")),
            is_char=as_bool(entry.get("is_char")),
        )
    st = host.stat(path)
    if st is None:
        return DevNode(exists=False)
    return DevNode(
        exists=True,
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        owner=_user_name(st.st_uid),
        group=_group_name(st.st_gid),
        is_char=stat.S_ISCHR(st.st_mode),
    )


def _user_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _group_name(gid: int) -> str | None:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None
