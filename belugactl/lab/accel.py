"""Which accelerator the guests use: TCG unless asked otherwise, with KVM detected and reported.

KVM was seen failing with Debian's QEMU 7.2 on this machine kind (`-cpu host` aborts on MSR 0x10a,
`-cpu qemu64` hangs in firmware), and region commit fails in KVM guests of stock kernels
("Failed to synchronize CPU cache state"). So KVM is only used when asked for, and reported.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass

KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12


@dataclass(frozen=True)
class AccelReport:
    chosen: str
    kvm_usable: bool
    kvm_detail: str

    def to_dict(self) -> dict[str, object]:
        return {"chosen": self.chosen, "kvm_usable": self.kvm_usable, "kvm_detail": self.kvm_detail}


def probe_kvm(device: str = "/dev/kvm") -> tuple[bool, str]:
    if not os.path.exists(device):
        return False, f"{device} does not exist"
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"cannot open {device}: {exc.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return False, f"{device} refused KVM_GET_API_VERSION: {exc.strerror}"
    finally:
        os.close(fd)
    if version != KVM_API_VERSION:
        return False, f"{device} reports KVM API {version}, expected {KVM_API_VERSION}"
    return True, f"{device} answers (KVM API {version})"


def choose(requested: str) -> AccelReport:
    usable, detail = probe_kvm()
    if requested == "auto":
        # Detected is not the same as working: see the module docstring. TCG stays the default.
        return AccelReport("tcg", usable, detail + ("; not used by default, try --accel kvm" if usable else ""))
    return AccelReport(requested, usable, detail)
