"""PCI devices from /sys/bus/pci: GPUs, CXL adapters, the root ports above them, link state.

The root port of a device is the first PCI function below the host bridge (`pciDDDD:BB`) on the
device's resolved sysfs path (reference ops-cli.md 1.4); switches in between do not matter, the
DDIO register lives on the root port. Config space bytes 0x180 (perfctrlsts_0) and 0x185 (the byte
holding TPHDIS of perfctrlsts_1) are read here as facts; whether they mean "DDIO on" is the
doctor's decision (Intel only).
"""

from __future__ import annotations

import os
import re

from belugactl.host.host import Host
from belugactl.host.snapshot import PciDevice, RootPort

PCI_DEVICES = "/sys/bus/pci/devices"
PERFCTRLSTS_0 = 0x180
PERFCTRLSTS_1_TPH_BYTE = 0x185

VENDOR_NVIDIA = 0x10DE
VENDOR_AMD_GPU = 0x1002
GPU_VENDORS = frozenset({VENDOR_NVIDIA, VENDOR_AMD_GPU})

CLASS_CXL_MEMORY = 0x0502  # base 05 memory controller, sub 02 CXL (prog-if 0x10: CXL memory device)
CLASS_NVME = 0x0108
CLASS_3D_CONTROLLER = 0x0302
CLASS_BRIDGE_BASE = 0x06
VENDOR_INTEL = 0x8086
# Intel DSA copy engines (drivers/dma/idxd: DSA_SPR0, DSA_GNRD, DSA_DMR); their class (0x0880xx,
# "other system peripheral") is shared with many platform functions, so the device id decides.
DSA_DEVICE_IDS = frozenset({0x0B25, 0x11FB, 0x1212})

BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")


def pci_chain(real_path: str | None) -> list[str]:
    """The PCI functions on a resolved sysfs path, from the root port down to the device."""
    if not real_path:
        return []
    chain: list[str] = []
    below_host_bridge = False
    for part in real_path.split("/"):
        if _HOST_BRIDGE_RE.match(part):
            below_host_bridge = True
            chain = []
        elif below_host_bridge and BDF_RE.match(part):
            chain.append(part.lower())
    return chain


def root_port_of(real_path: str | None) -> str | None:
    """The root port above a device; None when the device sits on the root complex itself."""
    chain = pci_chain(real_path)
    return chain[0] if len(chain) > 1 else None


def switch_upstream_port_of(real_path: str | None) -> str | None:
    """The upstream port of the nearest switch above a device; None when it sits on a root port.

    Behind a switch the chain is [root port, (upper switches' ports...,) upstream port, downstream
    port, device]: the nearest switch's upstream port is two functions above the device. Directly
    attached, it is [root port, device].
    """
    chain = pci_chain(real_path)
    return chain[-3] if len(chain) >= 4 else None


def classify(class_code: int | None, vendor: int | None) -> str | None:
    """"gpu", "cxl", "nvme", "nic", "other" for devices discovery reports; None for the rest."""
    if class_code is None:
        return None
    base = class_code >> 16
    if (class_code >> 8) == CLASS_CXL_MEMORY:
        return "cxl"
    if base == 0x03 and (vendor in GPU_VENDORS or (class_code >> 8) == CLASS_3D_CONTROLLER):
        return "gpu"
    if (class_code >> 8) == CLASS_NVME:
        return "nvme"
    if base == 0x02:
        return "nic"
    if base in (0x03, 0x12):
        # A BMC's VGA function or an accelerator: worth listing, not a GPU for KV caching.
        return "other"
    return None


def _node(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None


def read_pci(host: Host, problems: list[str]) -> tuple[list[PciDevice], list[RootPort]]:
    devices: list[PciDevice] = []
    if not host.is_dir(PCI_DEVICES):
        problems.append(f"{PCI_DEVICES} is missing: no PCI information (is /sys mounted?)")
        return [], []
    for bdf in host.listdir(PCI_DEVICES):
        base = f"{PCI_DEVICES}/{bdf}"
        class_code = host.read_int(f"{base}/class", 16)
        vendor = host.read_int(f"{base}/vendor", 16)
        kind = classify(class_code, vendor)
        if kind is None and vendor == VENDOR_INTEL and host.read_int(f"{base}/device", 16) in DSA_DEVICE_IDS:
            kind = "dsa"
        if kind is None:
            continue
        driver_link = host.readlink(f"{base}/driver")
        devices.append(
            PciDevice(
                bdf=bdf.lower(),
                vendor=vendor,
                device=host.read_int(f"{base}/device", 16),
                class_code=class_code,
                numa_node=_node(host.read_int(f"{base}/numa_node", 10)),
                kind=kind,
                root_port=root_port_of(host.resolve(base)),
                link_speed=host.read_str(f"{base}/current_link_speed") or None,
                link_width=host.read_int(f"{base}/current_link_width", 10),
                driver=os.path.basename(driver_link) if driver_link else None,
                max_link_speed=host.read_str(f"{base}/max_link_speed") or None,
                max_link_width=host.read_int(f"{base}/max_link_width", 10),
            )
        )
    return devices, read_root_ports(host, devices)


def read_root_ports(host: Host, devices: list[PciDevice]) -> list[RootPort]:
    """The root ports above GPUs and CXL adapters (where DDIO matters for the pool)."""
    below: dict[str, list[str]] = {}
    for dev in devices:
        if dev.kind in ("gpu", "cxl") and dev.root_port:
            below.setdefault(dev.root_port, []).append(dev.bdf)
    ports: list[RootPort] = []
    for bdf in sorted(below):
        base = f"{PCI_DEVICES}/{bdf}"
        config = f"{base}/config"
        st = host.stat(config)
        data = host.read_bytes(config, 8, PERFCTRLSTS_0)
        # Without root (or without ECAM) the kernel returns only the first 64 or 256 bytes.
        readable = data is not None and len(data) > PERFCTRLSTS_1_TPH_BYTE - PERFCTRLSTS_0
        ports.append(
            RootPort(
                bdf=bdf,
                vendor=host.read_int(f"{base}/vendor", 16),
                device=host.read_int(f"{base}/device", 16),
                perfctrlsts_0=data[0] if readable and data else None,
                config_readable=readable,
                perfctrlsts_1=data[PERFCTRLSTS_1_TPH_BYTE - PERFCTRLSTS_0] if readable and data else None,
                config_size=st.st_size if st is not None else None,
                numa_node=_node(host.read_int(f"{base}/numa_node", 10)),
                devices=sorted(below[bdf]),
            )
        )
    return ports
