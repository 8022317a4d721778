"""The ram profile's CXL topology as QEMU arguments: N volatile type-3 devices, under root ports or a switch.

Pure functions (argv lists only), following shared/reference/qemu-cxl-lab-v2.md:

- one `pxb-cxl` host bridge; without a switch every device sits on its own `cxl-rp` root port (at
  least two ports: QEMU 7.2 dropped writes behind a lone port, 10 no longer does, two do no harm);
- with `switch`, a single root port carries a `cxl-upstream` port whose `cxl-downstream` ports carry the
  devices, so the switch (not the host bridge) interleaves;
- device i of every guest is backed by the same file i (`share=on`) and carries the same serial
  0x10+i: it is one device seen by several hosts, and hosts order region targets by serial (memdev
  names follow probe order and change between boots);
- the fixed memory window (CFMWS) targets the host bridge with a 4 KiB granularity and is big enough
  for an N-way region across all devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
DECODER_UNIT = 256 * 1024 * 1024  # CXL decoders map memory in 256 MiB units per way
MIN_WINDOW = 4 * GIB
MAX_DEVICES = 8
SERIAL_BASE = 0x10
GRANULARITY = 4096
BUS_NR = 12
HOST_BRIDGE = "cxl.1"


def _opt(path: Path | str) -> str:
    """A path inside a QEMU option string, where a comma separates options unless doubled."""
    return str(path).replace(",", ",,")


@dataclass(frozen=True)
class RamTopology:
    backing: tuple[Path, ...]  # one file per device, shared by every guest of the lab
    device_size: int  # bytes per device, a multiple of 256 MiB
    switch: bool = False

    @property
    def devices(self) -> int:
        return len(self.backing)

    def validate(self) -> None:
        if not 1 <= self.devices <= MAX_DEVICES:
            raise ValueError(f"between 1 and {MAX_DEVICES} devices, not {self.devices}")
        if self.device_size <= 0 or self.device_size % DECODER_UNIT:
            raise ValueError(f"device size {self.device_size} is not a positive multiple of 256 MiB")


def serial(device: int) -> int:
    return SERIAL_BASE + device


def window_size(devices: int, device_size: int) -> int:
    """Room for one region interleaved across every device: N * size, rounded to N * 256 MiB, >= 4 GiB."""
    unit = devices * DECODER_UNIT
    need = -(-devices * device_size // unit) * unit
    return max(MIN_WINDOW, -(-need // GIB) * GIB)


def size_arg(size: int) -> str:
    if size % GIB == 0:
        return f"{size // GIB}G"
    return f"{size // (1024 * 1024)}M"


def cxl_args(topo: RamTopology) -> list[str]:
    topo.validate()
    args: list[str] = []
    for i, path in enumerate(topo.backing):
        args += ["-object", f"memory-backend-file,id=vmem{i},share=on,mem-path={_opt(path)},size={topo.device_size}"]
    args += ["-device", f"pxb-cxl,bus_nr={BUS_NR},bus=pcie.0,id={HOST_BRIDGE}"]
    # The switch hangs off one root port, as recorded; without one, a port per device (two at least).
    ports = 1 if topo.switch else max(2, topo.devices)
    for p in range(ports):
        args += ["-device", f"cxl-rp,port={p},bus={HOST_BRIDGE},id=rp{p},chassis=0,slot={2 + p}"]
    if topo.switch:
        args += ["-device", "cxl-upstream,bus=rp0,id=us0"]
        for i in range(topo.devices):
            args += ["-device", f"cxl-downstream,port={i},bus=us0,id=swport{i},chassis=0,slot={4 + i}"]
    for i in range(topo.devices):
        bus = f"swport{i}" if topo.switch else f"rp{i}"
        args += ["-device", f"cxl-type3,bus={bus},volatile-memdev=vmem{i},id=cxl-vmem{i},sn={serial(i):#x}"]
    window = size_arg(window_size(topo.devices, topo.device_size))
    granularity = f"{GRANULARITY // 1024}k"
    fmw = f"cxl-fmw.0.targets.0={HOST_BRIDGE},cxl-fmw.0.size={window},cxl-fmw.0.interleave-granularity={granularity}"
    args += ["-M", fmw]
    return args
