"""What every check gets: the host snapshot, and what the manifest expects of this host (if any)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from belugactl.host.snapshot import DaxDevice, HostSnapshot, NumaNode

if TYPE_CHECKING:
    from belugactl.host.host import Host


@dataclass(frozen=True)
class HugepageWant:
    """Hugepages the manifest wants on one NUMA node."""

    node: int
    page_size: int  # bytes
    count: int


@dataclass(frozen=True)
class Expectations:
    """The parts of the manifest (and its entry for this host) that doctor checks against.

    Kept separate from the manifest schema so that checks read a handful of plain fields, and a
    change in the schema touches only `expectations.from_manifest`.
    """

    host_name: str
    pool_size: int | None = None  # usable bytes of the dax device the layout is built on
    region_size: int | None = None  # CXL region size, when the manifest says it apart from the pool size
    align: int | None = None  # devdax align, bytes
    dax_device: str | None = None  # "dax0.0" when the manifest names it
    source: str | None = None  # "region" (build from memdevs) | "dax" (existing device)
    region_type: str | None = None  # "pmem" | "ram"
    namespace_uuid: str | None = None
    namespace_name: str | None = None
    interleave_ways: int | None = None
    memdev_serials: tuple[int, ...] = ()  # empty: "all", or chosen by switch/count
    memdev_switch: str | None = None  # pool.source.memdevs.switch: the switch's upstream port, or "any"
    memdev_count: int | None = None  # pool.source.memdevs.count: the first N by serial
    hosts_sharing: int = 1  # hosts in the manifest: > 1 means the media is shared
    hugepages: tuple[HugepageWant, ...] = ()
    thp: str | None = None  # "always" | "madvise" | "never"
    ddio: str | None = None  # "disabled" | "enabled" | "unmanaged"
    pool_memory: str | None = None  # "uncachable" | "write-back"
    cxl_node_cpuless: bool = True
    cxl_nodes: int | None = None  # CXL memory nodes `numactl --hardware` should show (online, CPU-less)
    gpus: int | None = None  # GPUs this host should have
    dev_owner: str | None = None  # pool.permissions of the /dev node: user name or numeric id
    dev_group: str | None = None
    dev_mode: int | None = None  # permission bits, e.g. 0o660
    layout: Any = None  # belugactl.model.layout.PoolLayout when the model provides one
    manifest: Any = None  # the validated belugactl.model.manifest_schema.Manifest
    entry: Any = None  # that manifest's Host entry for this machine
    manifest_file: str | None = None  # the path given with -f, so fixes name it instead of "MANIFEST"


@dataclass(frozen=True)
class DoctorContext:
    snapshot: HostSnapshot
    expect: Expectations | None = None
    # The Host the snapshot came from: only for checks that must read bytes themselves (the pool
    # header at offset 0 of the dax device). Everything else comes from the snapshot.
    host: Host | None = None

    # --- facts derived from the snapshot that several checks share ---------------------------
    @property
    def has_cxl(self) -> bool:
        cxl = self.snapshot.cxl
        return bool(cxl.bus_present or cxl.memdevs or cxl.regions or self.snapshot.cxl_adapters)

    @property
    def is_intel(self) -> bool:
        return self.snapshot.cpu.vendor == "GenuineIntel"

    def pool_dax(self) -> DaxDevice | None:
        """The dax device that holds (or would hold) the pool.

        The manifest's device name when it gives one; with a manifest that builds the pool from a
        region, the one dax device on a CXL region (setup made it); None when there is none, it is
        ambiguous, or there is no manifest: without one nothing says which device is the pool, and
        doctor never guesses (checks/common.py skip_without_manifest says so).
        """
        snap = self.snapshot
        if self.expect is None:
            return None
        if self.expect.dax_device:
            return snap.dax_device(self.expect.dax_device)
        cxl_dax = self.cxl_dax_devices()
        if len(cxl_dax) == 1:
            return cxl_dax[0]
        return None

    def cxl_dax_devices(self) -> list[DaxDevice]:
        """Dax devices backed by CXL memory.

        A dax device's physical range inside a CXL region's range marks it CXL-backed; without
        ranges, a devdax namespace on a CXL nd region does; with neither, a dax device on a host
        whose CXL regions have no libnvdimm namespaces (ram regions) counts.
        """
        snap = self.snapshot
        regions = [r for r in snap.cxl.regions if r.resource is not None and r.size]
        found: list[DaxDevice] = []
        cxl_nd_regions = {r.dev for r in snap.nd.regions if (r.provider or "").upper() == "CXL"}
        ns_chardevs = {ns.chardev for ns in snap.nd.namespaces if ns.region in cxl_nd_regions and ns.chardev}
        for dev in snap.dax:
            if dev.resource is not None and regions:
                if any(r.resource <= dev.resource < r.resource + r.size for r in regions):  # type: ignore[operator]
                    found.append(dev)
            elif dev.name in ns_chardevs or (snap.cxl.regions and not cxl_nd_regions):
                # No address to compare: a namespace on a CXL nd region says so, and on a host whose CXL
                # regions carry no libnvdimm namespaces (ram regions) a dax device is taken as CXL-backed.
                found.append(dev)
        return found

    def cxl_nodes(self) -> list[NumaNode]:
        """NUMA nodes discovered to hold CXL memory: memory and no CPUs, or named by a CXL device.

        Discovered, never assumed: the node number changes with firmware and boot order.
        """
        snap = self.snapshot
        ids: set[int] = set()
        for dev in self.cxl_dax_devices():
            if dev.mode == "system-ram" and dev.target_node is not None:
                ids.add(dev.target_node)
        for region in snap.nd.regions:
            if (region.provider or "").upper() == "CXL" and region.target_node is not None:
                ids.add(region.target_node)
        nodes = [n for n in snap.numa if n.id in ids]
        if not nodes and self.has_cxl:
            nodes = [n for n in snap.numa if n.cpuless and n.has_memory]
        return nodes
