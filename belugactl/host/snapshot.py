"""What discovery found on a host, as plain typed values.

Readers in `belugactl.host.read_*` fill these; workflows (doctor, plan) decide on them. Nothing
here touches a machine. Every fact that may be unknown is `X | None`: None means "could not be
read", never "false" or "zero". Things that could not be read or parsed are also listed in
`HostSnapshot.problems` so an operator sees why a fact is missing.

Field names are a contract with the doctor and setup code: add fields freely, never rename or
remove one. `to_dict()` gives the `discover --json` document (stable keys, in field order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# --- tools ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolInfo:
    """An external program discovery looked for (cxl, ndctl, daxctl, numactl, setpci, ...)."""

    name: str
    path: str | None = None  # where it was found; None when not installed
    version: str | None = None  # as the tool printed it, e.g. "76.1"
    major: int | None = None  # 76 for "76.1"; ndctl-family features are keyed on it
    minor: int | None = None
    error: str | None = None  # why the version could not be read, when installed but failing

    @property
    def installed(self) -> bool:
        return self.path is not None


# --- CXL ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemdevHealth:
    """A memory device's health as `cxl list -H` prints it (ndctl cxl/json.c; the device's Get Health Info).

    Every field may be missing from a device's answer; None then means "not reported", never "fine".
    """

    maintenance_needed: bool | None = None
    performance_degraded: bool | None = None
    hw_replacement_needed: bool | None = None
    media_normal: bool | None = None
    media_not_ready: bool | None = None
    media_persistence_lost: bool | None = None
    media_data_lost: bool | None = None
    media_powerloss_persistence_loss: bool | None = None
    media_shutdown_persistence_loss: bool | None = None
    media_persistence_loss_imminent: bool | None = None
    media_powerloss_data_loss: bool | None = None
    media_shutdown_data_loss: bool | None = None
    media_data_loss_imminent: bool | None = None
    ext_life_used: str | None = None  # "normal" | "warning" | "critical" | "unknown"
    ext_temperature: str | None = None
    ext_corrected_volatile: str | None = None  # "normal" | "warning" | "unknown"
    ext_corrected_persistent: str | None = None
    life_used_percent: int | None = None  # absent when the device does not implement it
    temperature: int | None = None  # degrees Celsius; absent when not implemented
    dirty_shutdowns: int | None = None
    volatile_errors: int | None = None
    pmem_errors: int | None = None


@dataclass(frozen=True)
class MediaError:
    """One poison (media error) record from `cxl list -L`.

    `offset` is relative to the region's base when listed by region, the device physical address
    when listed by memdev (ndctl Documentation/cxl/cxl-list.txt); `length` in bytes.
    """

    offset: int
    length: int
    source: str | None = None  # "Unknown" | "External" | "Internal" | "Injected" | "Vendor Specific"
    flags: str | None = None  # "More,", "Scanning,", "Overflow," as ndctl prints them


@dataclass(frozen=True)
class CxlMemdev:
    name: str  # "mem0"
    serial: int | None = None
    host_bdf: str | None = None  # PCI function of the adapter, "0000:35:00.0"
    pmem_size: int | None = None  # bytes; 0 when the device has no persistent partition
    ram_size: int | None = None
    numa_node: int | None = None
    state: str | None = None  # "enabled" | "disabled"
    firmware_version: str | None = None
    root_port: str | None = None  # BDF of the PCIe root port above host_bdf
    port: str | None = None  # CXL port the memdev's endpoint hangs off (e.g. "port1"), when known
    endpoint: str | None = None  # "endpoint5", when known
    # PCI address of the upstream port of the CXL switch the memdev sits behind ("0000:0d:00.0");
    # None when it hangs directly off a root port, or when only `cxl list` was read (it cannot tell)
    switch: str | None = None
    # `cxl list -M -H`; None: not reported (not listed, older capture, or the device did not answer)
    health: MemdevHealth | None = None


@dataclass(frozen=True)
class CxlDecoder:
    name: str  # "decoder0.0"
    resource: int | None = None  # HPA base
    size: int | None = None
    interleave_ways: int | None = None
    interleave_granularity: int | None = None
    pmem_capable: bool | None = None  # root decoders only
    volatile_capable: bool | None = None  # root decoders only
    max_available_extent: int | None = None  # root decoders only
    nr_targets: int | None = None  # non-endpoint decoders
    region: str | None = None  # region decoded through this decoder, if any
    kind: str | None = None  # "root" | "switch" | "endpoint"
    mode: str | None = None  # endpoint decoders: "ram" | "pmem" | "mixed" | "none"
    dpa_resource: int | None = None  # endpoint decoders
    dpa_size: int | None = None  # endpoint decoders
    state: str | None = None  # "disabled" when size is 0 (as `cxl list` says), else "enabled"
    target_list: list[str] = field(default_factory=list)  # dport ids (sysfs) or target names (cxl list -T)
    locked: bool | None = None


@dataclass(frozen=True)
class CxlRegion:
    name: str  # "region0"
    resource: int | None = None  # HPA base of the pool range
    size: int | None = None
    type: str | None = None  # "pmem" | "ram" (not printed by ndctl < v77; then read from sysfs mode)
    interleave_ways: int | None = None
    interleave_granularity: int | None = None
    decode_state: str | None = None  # "commit" | "reset"
    memdevs: list[str] = field(default_factory=list)  # in position order, when known
    state: str | None = None  # "enabled" | "disabled"
    uuid: str | None = None  # pmem regions
    root_decoder: str | None = None  # "decoder0.0"
    endpoint_decoders: list[str] = field(default_factory=list)  # in position order, when known
    # `cxl list -R -L`, offsets relative to the region's base: [] = read and none found; None = not
    # read (cxl < 80 has no -L, tracefs needs root, or a capture taken before discovery asked)
    media_errors: list[MediaError] | None = None


@dataclass(frozen=True)
class CxlState:
    bus_present: bool = False  # /sys/bus/cxl exists (cxl_core loaded)
    memdevs: list[CxlMemdev] = field(default_factory=list)
    root_decoders: list[CxlDecoder] = field(default_factory=list)
    switch_decoders: list[CxlDecoder] = field(default_factory=list)
    endpoint_decoders: list[CxlDecoder] = field(default_factory=list)
    regions: list[CxlRegion] = field(default_factory=list)
    buses: list[str] = field(default_factory=list)  # "root0"
    ports: list[str] = field(default_factory=list)  # "port1", "endpoint5"
    source: str | None = None  # "cxl list", "sysfs" or "cxl list+sysfs": where the facts came from

    def memdev(self, name: str) -> CxlMemdev | None:
        return next((m for m in self.memdevs if m.name == name), None)

    def region(self, name: str) -> CxlRegion | None:
        return next((r for r in self.regions if r.name == name), None)


# --- libnvdimm (ndctl) ----------------------------------------------------------------------


@dataclass(frozen=True)
class NdRegion:
    dev: str  # "region0" (libnvdimm's id space, separate from CXL region names)
    size: int | None = None
    align: int | None = None
    available_size: int | None = None
    type: str | None = None  # "pmem" | "blk"
    numa_node: int | None = None
    target_node: int | None = None
    provider: str | None = None  # bus provider, "CXL" for CXL pmem
    bus: str | None = None  # "ndbus0"
    persistence_domain: str | None = None
    state: str | None = None
    iset_id: int | None = None


@dataclass(frozen=True)
class NdNamespace:
    dev: str  # "namespace0.0"
    mode: str | None = None  # "fsdax" | "devdax" | "sector" | "raw"
    map: str | None = None  # "mem" | "dev" | "none"
    size: int | None = None
    uuid: str | None = None
    name: str | None = None
    align: int | None = None
    chardev: str | None = None  # "dax0.0" for devdax
    region: str | None = None  # nd region dev, "region0"
    state: str | None = None  # "disabled" when ndctl says so, else "enabled"
    blockdev: str | None = None  # "pmem0" for fsdax
    # The uuid in the namespace label, the one `ndctl create-namespace -u` pins. For fsdax/devdax
    # namespaces `uuid` above is the info block's (random per creation); ndctl prints the label's as
    # "raw_uuid" (with -v) and sysfs has it at /sys/bus/nd/devices/<dev>/uuid. None: not readable.
    label_uuid: str | None = None


@dataclass(frozen=True)
class NdState:
    regions: list[NdRegion] = field(default_factory=list)
    namespaces: list[NdNamespace] = field(default_factory=list)
    source: str | None = None  # "ndctl list" | "sysfs"


# --- device-dax -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DaxDevice:
    name: str  # "dax0.0"
    size: int | None = None
    align: int | None = None
    mode: str | None = None  # "devdax" | "system-ram" | None (unknown)
    target_node: int | None = None  # the node the memory becomes when onlined as system-ram
    numa_node: int | None = None  # the node closest to the device
    resource: int | None = None  # physical base address
    region_id: int | None = None  # dax region id
    dev_path: str | None = None  # "/dev/dax0.0"
    dev_exists: bool = False
    dev_uid: int | None = None
    dev_gid: int | None = None
    dev_mode: int | None = None  # permission bits, e.g. 0o600
    dev_owner: str | None = None  # user name, when the uid resolves on this host
    dev_group: str | None = None
    driver: str | None = None  # "device_dax" | "kmem" | "fsdev_dax" | ...
    online_memblocks: int | None = None  # system-ram only (daxctl)
    total_memblocks: int | None = None
    movable: bool | None = None
    state: str | None = None  # "disabled" when daxctl says so


# --- NUMA, hugepages, THP, memory hotplug ----------------------------------------------------


@dataclass(frozen=True)
class HugepageCount:
    total: int | None = None  # nr_hugepages
    free: int | None = None
    surplus: int | None = None


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: list[int] = field(default_factory=list)
    mem_total: int | None = None  # bytes
    mem_free: int | None = None  # bytes
    hugepages: dict[int, HugepageCount] = field(default_factory=dict)  # keyed by page size in bytes
    has_memory: bool | None = None  # from /sys/devices/system/node/has_memory
    has_cpu: bool | None = None  # from /sys/devices/system/node/has_cpu
    distance: list[int] = field(default_factory=list)  # to node 0..N, as the kernel lists them

    @property
    def cpuless(self) -> bool:
        return not self.cpus


@dataclass(frozen=True)
class Thp:
    enabled: str | None = None  # the bracketed choice: "always" | "madvise" | "never"
    defrag: str | None = None
    available_enabled: list[str] = field(default_factory=list)
    available_defrag: list[str] = field(default_factory=list)
    hpage_pmd_size: int | None = None


@dataclass(frozen=True)
class MemoryPolicy:
    auto_online_blocks: str | None = None  # "offline" | "online" | "online_movable" | "online_kernel"
    memory_block_size: int | None = None  # bytes (sysfs prints hex without 0x)


# --- PCI ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PciDevice:
    bdf: str  # "0000:18:00.0"
    vendor: int | None = None  # 0x10de
    device: int | None = None
    class_code: int | None = None  # 24-bit, 0x030200
    numa_node: int | None = None  # -1 in sysfs becomes None
    kind: str = "other"  # "gpu" | "cxl" | "nvme" | "nic" | "dsa" (Intel DSA copy engine) | "other"
    root_port: str | None = None  # BDF of the root port above it
    link_speed: str | None = None  # current_link_speed, e.g. "32.0 GT/s PCIe"
    link_width: int | None = None
    driver: str | None = None
    max_link_speed: str | None = None
    max_link_width: int | None = None


@dataclass(frozen=True)
class RootPort:
    bdf: str
    vendor: int | None = None
    device: int | None = None
    perfctrlsts_0: int | None = None  # byte at config 0x180 (Intel: bit 7 use_allocating_flow_wr, bit 3 NoSnoopOpWrEn)
    config_readable: bool = False  # could the extended config space (>= 0x100) be read
    perfctrlsts_1: int | None = None  # byte at config 0x185 (Intel: bit 0 = TPHDIS)
    config_size: int | None = None  # 4096 means extended config space (ECAM) is available
    numa_node: int | None = None
    devices: list[str] = field(default_factory=list)  # GPU/CXL BDFs below this port


# --- CPU, kernel, MTRR ----------------------------------------------------------------------


@dataclass(frozen=True)
class CpuInfo:
    vendor: str | None = None  # "GenuineIntel" | "AuthenticAMD" | ...
    model_name: str | None = None
    family: int | None = None
    model: int | None = None
    flags: frozenset[str] = field(default_factory=frozenset)
    sockets: int | None = None
    cpus: int | None = None  # logical CPUs listed in /proc/cpuinfo
    stepping: int | None = None
    hypervisor: bool | None = None  # the "hypervisor" flag: running as a guest
    phys_address_bits: int | None = None  # "address sizes: N bits physical": the largest range it can map


@dataclass(frozen=True)
class KernelInfo:
    release: str | None = None  # "6.1.0-28-amd64"
    version: str | None = None  # the "#1 SMP PREEMPT_DYNAMIC Debian ..." string
    cmdline: str | None = None
    lockdown: str | None = None  # "none" | "integrity" | "confidentiality"; None when not readable
    in_container: bool | None = None
    lockdown_available: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MtrrEntry:
    reg: int
    base: int
    size: int  # bytes
    type: str  # as the kernel spells it: "uncachable", "write-back", ...
    count: int | None = None


# --- the whole host -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSnapshot:
    hostname: str | None = None
    root: str = "/"
    tools: dict[str, ToolInfo] = field(default_factory=dict)
    cxl: CxlState = field(default_factory=CxlState)
    nd: NdState = field(default_factory=NdState)
    dax: list[DaxDevice] = field(default_factory=list)
    numa: list[NumaNode] = field(default_factory=list)
    thp: Thp = field(default_factory=Thp)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    pci: list[PciDevice] = field(default_factory=list)
    root_ports: list[RootPort] = field(default_factory=list)
    cpu: CpuInfo = field(default_factory=CpuInfo)
    kernel: KernelInfo = field(default_factory=KernelInfo)
    mtrr: list[MtrrEntry] | None = None  # None: /proc/mtrr absent (no MTRR support, or not x86)
    udev_db: bool = False  # a udev database exists (/run/udev/data); else facts came from sysfs only
    problems: list[str] = field(default_factory=list)  # what could not be read or parsed
    hugepages: dict[int, HugepageCount] = field(default_factory=dict)  # system-wide, by page size in bytes
    # Topics the caller did not ask discovery for (`discover(host, topics=...)`): their fields hold
    # empty defaults, which mean "not read", not "absent". Empty for a full discovery.
    topics_skipped: list[str] = field(default_factory=list)

    # --- lookups the checks use -------------------------------------------------------------
    def tool(self, name: str) -> ToolInfo:
        return self.tools.get(name) or ToolInfo(name)

    def dax_device(self, name: str) -> DaxDevice | None:
        name = name.removeprefix("/dev/")
        return next((d for d in self.dax if d.name == name), None)

    def numa_node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.numa if n.id == node_id), None)

    def root_port(self, bdf: str) -> RootPort | None:
        return next((r for r in self.root_ports if r.bdf == bdf), None)

    @property
    def gpus(self) -> list[PciDevice]:
        return [d for d in self.pci if d.kind == "gpu"]

    @property
    def cxl_adapters(self) -> list[PciDevice]:
        return [d for d in self.pci if d.kind == "cxl"]

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _plain(value: Any) -> Any:
    """Dataclasses, dicts, sets and lists as JSON-ready values, keys in declaration order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
