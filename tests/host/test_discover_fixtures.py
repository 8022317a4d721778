"""Every reader on every fixture tree, asserting the values the trees were written with."""

from __future__ import annotations

import pytest

from tests.support.fixture_trees import TREES, snapshot

GiB = 1 << 30
MiB = 1 << 20


@pytest.mark.parametrize("name", TREES)
def test_fixture_discovers_without_problems(name: str) -> None:
    snap = snapshot(name)
    assert snap.problems == []
    assert snap.root.endswith(name)


# --- tools -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "version", "major", "minor"),
    [("lab-guest", "76.1", 76, 1), ("beluga-intel", "78", 78, None), ("amd-host", "79", 79, None),
     ("nocxl", "76.1", 76, 1)],
)
def test_tools(name: str, version: str, major: int, minor: int | None) -> None:
    tools = snapshot(name).tools
    for tool in ("cxl", "ndctl", "daxctl"):
        assert tools[tool].version == version
        assert tools[tool].major == major
        assert tools[tool].minor == minor
        assert tools[tool].path == f"/usr/bin/{tool}"
    assert tools["setpci"].installed
    assert tools["setpci"].major == 3


# --- CXL ---------------------------------------------------------------------------------------


def test_cxl_lab_guest() -> None:
    cxl = snapshot("lab-guest").cxl
    assert cxl.bus_present
    assert cxl.source == "cxl list+sysfs"
    [mem] = cxl.memdevs
    assert (mem.name, mem.pmem_size, mem.ram_size, mem.serial) == ("mem0", 512 * MiB, 0, 1)
    assert mem.host_bdf == "0000:0d:00.0"
    assert mem.root_port == "0000:0c:00.0"
    assert mem.numa_node is None  # the tool omits it and sysfs says -1
    assert mem.endpoint == "endpoint2"
    assert mem.port == "port1"
    assert mem.state == "enabled"
    [root] = cxl.root_decoders
    assert root.name == "decoder0.0"
    assert root.pmem_capable is True and root.volatile_capable is True
    assert root.size == 4 * GiB and root.resource == 0x3D0000000
    assert root.max_available_extent == 4 * GiB - 512 * MiB
    assert root.region == "region0"
    assert root.target_list == ["12"]  # `cxl list` without -T prints no targets: sysfs dport ids (as recorded)
    [ep] = cxl.endpoint_decoders
    # dpa_size as kernel 6.1 prints it, zero-padded to 16 hex digits
    assert (ep.name, ep.mode, ep.dpa_size, ep.region) == ("decoder2.0", "pmem", 512 * MiB, "region0")
    assert [d.name for d in cxl.switch_decoders] == ["decoder1.0"]  # sysfs only: never listed by the tool
    [region] = cxl.regions
    assert region.name == "region0"
    # ndctl 76 prints no type and kernel 6.1 has no region/mode: taken from the endpoint decoder.
    assert region.type == "pmem"
    assert (region.size, region.resource, region.interleave_ways) == (512 * MiB, 0x3D0000000, 1)
    assert region.decode_state == "commit"
    assert region.memdevs == ["mem0"]
    assert region.endpoint_decoders == ["decoder2.0"]
    assert region.root_decoder == "decoder0.0"
    assert region.uuid == "4bd6f2ae-6a0d-4a3f-9a83-b3c7a4f0f1d2"
    assert cxl.buses == ["root0"]
    assert cxl.ports == ["endpoint2", "port1"]


def test_cxl_beluga_intel_two_adapters_one_interleaved_region() -> None:
    cxl = snapshot("beluga-intel").cxl
    assert [(m.name, m.host_bdf, m.root_port, m.numa_node, m.ram_size, m.pmem_size) for m in cxl.memdevs] == [
        ("mem0", "0000:38:00.0", "0000:37:01.0", 0, 256 * GiB, 0),
        ("mem1", "0000:b8:00.0", "0000:b7:01.0", 1, 256 * GiB, 0),
    ]
    assert cxl.memdevs[0].serial == 0x1A2B3C4D5E6F0001
    assert [(m.endpoint, m.port) for m in cxl.memdevs] == [("endpoint5", "port1"), ("endpoint6", "port2")]
    [root] = cxl.root_decoders
    assert root.pmem_capable is False  # the tool prints the flag only when true
    assert root.volatile_capable is True
    assert (root.interleave_ways, root.interleave_granularity, root.nr_targets) == (2, 4096, 2)
    assert root.max_available_extent == 0
    [region] = cxl.regions
    assert (region.type, region.size, region.resource) == ("ram", 512 * GiB, 0x10000000000)
    assert region.memdevs == ["mem0", "mem1"]
    assert region.endpoint_decoders == ["decoder5.0", "decoder6.0"]
    assert [d.name for d in cxl.endpoint_decoders] == ["decoder5.0", "decoder6.0"]
    assert all(d.mode == "ram" and d.dpa_size == 256 * GiB for d in cxl.endpoint_decoders)


def test_cxl_amd_host() -> None:
    cxl = snapshot("amd-host").cxl
    [mem] = cxl.memdevs
    assert (mem.host_bdf, mem.root_port, mem.ram_size) == ("0000:c1:00.0", "0000:c0:01.1", 256 * GiB)
    [region] = cxl.regions
    assert (region.type, region.interleave_ways, region.interleave_granularity) == ("ram", 1, 256)
    assert region.uuid is None  # ram regions have an empty uuid


def test_cxl_nocxl_is_empty_and_says_so() -> None:
    cxl = snapshot("nocxl").cxl
    assert not cxl.bus_present
    assert (cxl.memdevs, cxl.regions, cxl.root_decoders, cxl.endpoint_decoders) == ([], [], [], [])
    assert cxl.source == "cxl list"  # the tool ran and printed "[\n]" with a warning


# --- nd / dax -------------------------------------------------------------------------------


def test_nd_lab_guest_devdax_namespace_map_mem() -> None:
    nd = snapshot("lab-guest").nd
    [region] = nd.regions
    assert (region.dev, region.provider, region.bus, region.align) == ("region0", "CXL", "ndbus0", 16 * MiB)
    assert region.iset_id == (1 << 64) - 6382611090938810793  # printed as a negative int64
    [ns] = nd.namespaces
    assert (ns.dev, ns.mode, ns.map, ns.size, ns.align) == ("namespace0.0", "devdax", "mem", 510 * MiB, 2 * MiB)
    assert (ns.chardev, ns.region, ns.name) == ("dax0.0", "region0", "beluga-lab")
    # ndctl's "uuid" is the devdax info block's; the label uuid setup pinned comes from sysfs.
    assert ns.uuid == "9e3b7f1c-4a62-4d0e-b8f5-2c1d6a7e9b30"
    assert ns.label_uuid == "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"


@pytest.mark.parametrize("name", ["beluga-intel", "amd-host", "nocxl"])
def test_nd_empty_output_means_nothing(name: str) -> None:
    nd = snapshot(name).nd
    assert (nd.regions, nd.namespaces, nd.source) == ([], [], "ndctl list")


def test_dax_lab_guest() -> None:
    [dax] = snapshot("lab-guest").dax
    assert (dax.name, dax.mode, dax.size, dax.align) == ("dax0.0", "devdax", 510 * MiB, 2 * MiB)
    assert (dax.target_node, dax.numa_node, dax.region_id, dax.driver) == (1, 0, 0, "device_dax")
    assert dax.resource == 0x3D0000000 + 2 * MiB  # map=mem: data begins 2 MiB into the region
    assert (dax.dev_path, dax.dev_exists, dax.dev_mode, dax.dev_owner, dax.dev_group) == (
        "/dev/dax0.0", True, 0o660, "root", "root",
    )


def test_dax_beluga_intel_onlined_as_system_ram() -> None:
    [dax] = snapshot("beluga-intel").dax
    assert (dax.mode, dax.driver, dax.target_node, dax.size) == ("system-ram", "kmem", 2, 512 * GiB)
    assert (dax.online_memblocks, dax.total_memblocks, dax.movable) == (256, 256, True)
    assert dax.dev_exists is False  # kmem owns it: no character device


def test_dax_amd_host_permissions() -> None:
    [dax] = snapshot("amd-host").dax
    assert (dax.mode, dax.driver) == ("devdax", "device_dax")
    assert (dax.dev_uid, dax.dev_gid, dax.dev_mode, dax.dev_group) == (0, 1001, 0o660, "beluga")


def test_dax_nocxl() -> None:
    assert snapshot("nocxl").dax == []


# --- NUMA, hugepages, THP, memory policy -----------------------------------------------------


def test_numa_beluga_intel_cpuless_cxl_node() -> None:
    nodes = snapshot("beluga-intel").numa
    assert [n.id for n in nodes] == [0, 1, 2]
    assert nodes[0].cpus == list(range(0, 8)) and nodes[1].cpus == list(range(8, 16))
    cxl_node = nodes[2]
    assert cxl_node.cpus == [] and cxl_node.cpuless
    assert cxl_node.has_memory is True and cxl_node.has_cpu is False
    assert cxl_node.mem_total == 512 * GiB
    assert nodes[0].mem_total == 263738368 * 1024
    assert nodes[0].hugepages[2 * MiB].total == 4096 and nodes[0].hugepages[2 * MiB].free == 4000
    assert nodes[0].hugepages[GiB].total == 0
    assert nodes[0].distance == [10, 21, 14]
    assert snapshot("beluga-intel").hugepages[2 * MiB].total == 8192


def test_lab_guest_has_the_lab_manifests_hugepages() -> None:
    snap = snapshot("lab-guest")
    [node] = snap.numa
    assert (node.hugepages[2 * MiB].total, node.hugepages[2 * MiB].free) == (64, 64)
    assert snap.hugepages[2 * MiB].total == 64 and snap.hugepages[GiB].total == 0
    # granularity as recorded from the lab guest (placeholder 1024 before)
    assert snap.cxl.regions[0].interleave_granularity == 256


def test_numa_single_node_trees() -> None:
    for name, cpus in (("lab-guest", [0]), ("amd-host", list(range(16))), ("nocxl", list(range(8)))):
        [node] = snapshot(name).numa
        assert node.cpus == cpus
        assert node.has_cpu is True and node.has_memory is True


@pytest.mark.parametrize(
    ("name", "enabled", "auto_online", "block"),
    [("lab-guest", "madvise", "offline", 128 * MiB), ("beluga-intel", "madvise", "online_movable", 2 * GiB),
     ("amd-host", "madvise", "offline", 2 * GiB), ("nocxl", "always", "offline", 128 * MiB)],
)
def test_thp_and_memory_policy(name: str, enabled: str, auto_online: str, block: int) -> None:
    snap = snapshot(name)
    assert snap.thp.enabled == enabled
    assert snap.thp.defrag == "madvise"
    assert snap.thp.available_enabled == ["always", "madvise", "never"]
    assert snap.thp.hpage_pmd_size == 2 * MiB
    assert snap.memory.auto_online_blocks == auto_online
    assert snap.memory.memory_block_size == block


# --- PCI and root ports ----------------------------------------------------------------------


def test_pci_beluga_intel_gpus_and_root_ports() -> None:
    snap = snapshot("beluga-intel")
    gpus = snap.gpus
    assert len(gpus) == 8
    assert all(g.vendor == 0x10DE and g.class_code == 0x030200 and g.driver == "nvidia" for g in gpus)
    assert {g.root_port for g in gpus} == {
        "0000:15:01.0", "0000:2a:01.0", "0000:2a:02.0", "0000:95:01.0", "0000:aa:01.0", "0000:aa:02.0",
    }
    # Behind a PCIe switch the root port is still the one below the host bridge.
    by_bdf = {d.bdf: d for d in snap.pci}
    assert by_bdf["0000:18:00.0"].root_port == "0000:15:01.0"
    assert by_bdf["0000:98:00.0"].numa_node == 1
    assert by_bdf["0000:18:00.0"].link_speed == "32.0 GT/s PCIe" and by_bdf["0000:18:00.0"].link_width == 16
    assert [d.bdf for d in snap.cxl_adapters] == ["0000:38:00.0", "0000:b8:00.0"]
    # The BMC's VGA function is not a GPU; NIC and NVMe are classified.
    assert by_bdf["0000:03:00.0"].kind == "other"
    assert by_bdf["0000:29:00.0"].kind == "nic"
    assert by_bdf["0000:c9:00.0"].kind == "nvme"
    ports = {p.bdf: p for p in snap.root_ports}
    assert set(ports) == {g.root_port for g in gpus} | {"0000:37:01.0", "0000:b7:01.0"}
    assert "0000:28:01.0" not in ports  # above the NIC only: not the pool's concern
    for port in ports.values():
        assert port.config_readable and port.config_size == 4096
        assert port.perfctrlsts_0 == 0x80 and port.perfctrlsts_1 == 0x00
        assert port.vendor == 0x8086
    assert ports["0000:15:01.0"].devices == ["0000:18:00.0", "0000:19:00.0"]
    assert ports["0000:37:01.0"].devices == ["0000:38:00.0"]


def test_root_port_config_not_readable_without_root() -> None:
    [port] = snapshot("nocxl").root_ports
    assert port.bdf == "0000:17:02.0"
    assert port.config_readable is False
    assert port.perfctrlsts_0 is None and port.perfctrlsts_1 is None
    assert port.config_size == 64


def test_pci_amd_and_lab() -> None:
    amd = snapshot("amd-host")
    assert [g.bdf for g in amd.gpus] == ["0000:41:00.0", "0000:81:00.0"]
    assert {p.vendor for p in amd.root_ports} == {0x1022}
    lab = snapshot("lab-guest")
    assert lab.gpus == []
    assert [(d.bdf, d.kind, d.vendor, d.device) for d in lab.cxl_adapters] == [
        ("0000:0d:00.0", "cxl", 0x8086, 0x0D93)
    ]
    assert [p.bdf for p in lab.root_ports] == ["0000:0c:00.0"]


# --- CPU, kernel, MTRR, udev ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "vendor", "family", "model", "sockets", "cpus"),
    [("lab-guest", "AuthenticAMD", 15, 107, 1, 1), ("beluga-intel", "GenuineIntel", 6, 0x8F, 2, 16),
     ("amd-host", "AuthenticAMD", 0x19, 0x11, 1, 16), ("nocxl", "GenuineIntel", 6, 0x6A, 1, 8)],
)
def test_cpu(name: str, vendor: str, family: int, model: int, sockets: int, cpus: int) -> None:
    cpu = snapshot(name).cpu
    assert (cpu.vendor, cpu.family, cpu.model, cpu.sockets, cpu.cpus) == (vendor, family, model, sockets, cpus)
    assert "clflush" in cpu.flags
    assert cpu.hypervisor is (name == "lab-guest")


@pytest.mark.parametrize(
    ("name", "release", "udev"),
    [("lab-guest", "6.1.0-57-amd64", False), ("beluga-intel", "6.8.0-49-generic", True),
     ("amd-host", "6.8.0-49-generic", True), ("nocxl", "6.1.0-27-amd64", True)],
)
def test_kernel_and_udev(name: str, release: str, udev: bool) -> None:
    snap = snapshot(name)
    assert snap.kernel.release == release
    assert snap.kernel.lockdown == "none"
    assert snap.kernel.lockdown_available == ["none", "integrity", "confidentiality"]
    assert snap.kernel.in_container is False
    assert snap.udev_db is udev


def test_mtrr_entries() -> None:
    [lab] = snapshot("lab-guest").mtrr or []
    assert (lab.reg, lab.base, lab.size, lab.type, lab.count) == (0, 0xC0000000, GiB, "uncachable", 1)
    intel = snapshot("beluga-intel").mtrr or []
    assert [(m.base, m.size) for m in intel] == [(0x80000000, 2 * GiB), (0x20000000000, 256 * GiB)]
    assert [m.type for m in snapshot("amd-host").mtrr or []] == ["write-back", "write-back"]


def test_hostnames() -> None:
    assert [snapshot(n).hostname for n in ("lab-guest", "beluga-intel", "amd-host", "nocxl")] == [
        "lab-1", "beluga-gpu-03", "beluga-amd-01", "plain-01",
    ]
