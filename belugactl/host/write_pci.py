"""PCI config-space byte access through sysfs (`/sys/bus/pci/devices/BDF/config`), for DDIO.

Same kernel path as setpci(8), without needing pciutils. Writes are always read-modify-write of
one byte: the byte is read again just before the write, and if it changed since planning nothing
is written (someone else is changing it; better to stop than to clobber their bits).
"""

from __future__ import annotations

import errno
import os

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host


def config_path(bdf: str) -> str:
    return f"/sys/bus/pci/devices/{bdf}/config"


def read_config_byte(host: Host, bdf: str, offset: int) -> int | None:
    data = host.read_bytes(config_path(bdf), 1, offset)
    if not data:
        return None
    return data[0]


def _lockdown_error(bdf: str, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"the kernel refused a PCI config-space write to {bdf}",
        why=f"{exc.strerror or exc}; kernel lockdown (Secure Boot) forbids config-space writes from user space",
        fix="set DDIO in the BIOS (IIO settings) instead, or boot with lockdown off; "
        "`cat /sys/kernel/security/lockdown` shows the mode",
    )


def rmw_config_byte(
    host: Host, bdf: str, offset: int, *, clear_bits: int, set_bits: int, expect: int
) -> tuple[int, int]:
    """Change only the given bits of one config byte; return (before, after) as read from the device."""
    before = read_config_byte(host, bdf, offset)
    if before is None:
        raise StepFailed(
            f"cannot read config byte 0x{offset:x} of {bdf}",
            why="the extended config space is not readable (needs root and ECAM/MMCONFIG)",
            fix="run as root; check that `/sys/bus/pci/devices/BDF/config` is 4096 bytes long",
        )
    if before != expect:
        raise StepFailed(
            f"config byte 0x{offset:x} of {bdf} changed since planning (0x{expect:02x} -> 0x{before:02x})",
            why="something else is changing this register; nothing was written",
            fix="run `belugactl plan` again and look at what changed it",
        )
    value = (before & ~clear_bits & 0xFF) | set_bits
    if value != before:
        try:
            fd = os.open(host.path(config_path(bdf)), os.O_WRONLY)
            try:
                os.pwrite(fd, bytes([value]), offset)
            finally:
                os.close(fd)
        except PermissionError as exc:
            raise _lockdown_error(bdf, exc) from exc
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise _lockdown_error(bdf, exc) from exc
            raise StepFailed(f"writing config byte 0x{offset:x} of {bdf} failed", why=str(exc)) from exc
    after = read_config_byte(host, bdf, offset)
    if after is None or (after & (clear_bits | set_bits)) != (value & (clear_bits | set_bits)):
        shown = "unreadable" if after is None else f"0x{after:02x}"
        raise StepFailed(
            f"config byte 0x{offset:x} of {bdf} reads {shown} after writing 0x{value:02x}",
            why="the device did not keep the bits (the register may be locked by firmware on this CPU)",
            fix="set DDIO in the BIOS instead",
        )
    return before, after
