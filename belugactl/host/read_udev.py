"""The udev database, through pyudev where one exists (containers and minimal guests have none).

Discovery reads sysfs for every fact; udev adds the device node names (`DEVNAME`) udev rules may
have changed, so a renamed or symlinked dax node is still found. Without a udev database (no
/run/udev/data) or outside the live root, the sysfs defaults (`/dev/<name>`) stand.
"""

from __future__ import annotations

from belugactl.host.host import Host

UDEV_DB = "/run/udev/data"


def has_udev_db(host: Host) -> bool:
    return host.is_dir(UDEV_DB)


def dax_devnames(host: Host, problems: list[str]) -> dict[str, str] | None:
    """{"dax0.0": "/dev/dax0.0"} from udev, or None where udev cannot be asked."""
    if not host.is_live or not has_udev_db(host):
        return None
    try:
        import pyudev
    except ImportError:
        problems.append("pyudev is not installed: dax device nodes assumed at /dev/<name>")
        return None
    try:
        context = pyudev.Context()
        names = {}
        for device in context.list_devices(subsystem="dax"):
            if device.device_node:
                names[device.sys_name] = device.device_node
        return names
    except Exception as exc:  # pyudev wraps libudev; any failure here only loses a nicety
        problems.append(f"udev enumeration failed ({exc}); dax device nodes assumed at /dev/<name>")
        return None
