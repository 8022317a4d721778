"""Snapshots built in code for unit tests of single checks (the fixture trees cover whole hosts).

`beluga_like()` is a small, healthy Beluga-style host: Intel, one CXL adapter with its memdev, a
committed pmem region, a devdax namespace with map=mem, one GPU, DDIO off. Tests change one fact
with `dataclasses.replace` and look at the check that should notice.
"""

from __future__ import annotations

from dataclasses import replace

from belugactl.host.snapshot import (
    CpuInfo,
    CxlDecoder,
    CxlMemdev,
    CxlRegion,
    CxlState,
    DaxDevice,
    HostSnapshot,
    HugepageCount,
    KernelInfo,
    MemoryPolicy,
    NdNamespace,
    NdRegion,
    NdState,
    NumaNode,
    PciDevice,
    RootPort,
    Thp,
    ToolInfo,
)
from belugactl.units import GiB, MiB
from belugactl.workflows.doctor.context import DoctorContext, Expectations

REGION_BASE = 0x2080000000
POOL_SIZE = 510 * MiB
CXL_NODE = 5  # deliberately not the "usual" 2: checks must report what they discover

UUID = "5e1f0c2a-8a1b-4c3d-9e2f-0123456789ab"  # the label uuid `create-namespace -u` pinned
INFO_BLOCK_UUID = "c3d1a9e0-2b7f-4e65-8f10-9a8b7c6d5e4f"  # what ndctl prints as a devdax namespace's "uuid"


def tools(version: str = "76.1", major: int = 76) -> dict[str, ToolInfo]:
    return {n: ToolInfo(n, f"/usr/bin/{n}", version, major, 1) for n in ("cxl", "ndctl", "daxctl")}


def beluga_like() -> HostSnapshot:
    return HostSnapshot(
        hostname="beluga-01",
        tools=tools(),
        cxl=CxlState(
            bus_present=True,
            memdevs=[
                CxlMemdev(
                    "mem0",
                    serial=0x1234,
                    host_bdf="0000:38:00.0",
                    pmem_size=512 * MiB,
                    ram_size=0,
                    numa_node=0,
                    state="enabled",
                    root_port="0000:37:01.0",
                )
            ],
            root_decoders=[
                CxlDecoder(
                    "decoder0.0",
                    resource=REGION_BASE,
                    size=4 * GiB,
                    pmem_capable=True,
                    volatile_capable=True,
                    max_available_extent=0,
                    region="region0",
                    kind="root",
                )
            ],
            regions=[
                CxlRegion(
                    "region0",
                    resource=REGION_BASE,
                    size=512 * MiB,
                    type="pmem",
                    interleave_ways=1,
                    decode_state="commit",
                    memdevs=["mem0"],
                    state="enabled",
                )
            ],
            buses=["root0"],
        ),
        nd=NdState(
            regions=[NdRegion("region0", size=512 * MiB, provider="CXL", target_node=CXL_NODE)],
            namespaces=[
                NdNamespace(
                    "namespace0.0",
                    mode="devdax",
                    map="mem",
                    size=POOL_SIZE,
                    uuid=INFO_BLOCK_UUID,
                    name="beluga-pool",
                    label_uuid=UUID,
                    align=2 * MiB,
                    chardev="dax0.0",
                    region="region0",
                )
            ],
        ),
        dax=[
            DaxDevice(
                "dax0.0",
                size=POOL_SIZE,
                align=2 * MiB,
                mode="devdax",
                target_node=CXL_NODE,
                numa_node=0,
                resource=REGION_BASE + 2 * MiB,
                dev_path="/dev/dax0.0",
                dev_exists=True,
                dev_uid=0,
                dev_gid=990,
                dev_mode=0o660,
                dev_owner="root",
                dev_group="beluga",
                driver="device_dax",
            )
        ],
        numa=[
            NumaNode(
                0,
                cpus=list(range(8)),
                mem_total=64 * GiB,
                has_memory=True,
                has_cpu=True,
                hugepages={2 * MiB: HugepageCount(1024, 1024, 0)},
            ),
            NumaNode(
                1,
                cpus=list(range(8, 16)),
                mem_total=64 * GiB,
                has_memory=True,
                has_cpu=True,
                hugepages={2 * MiB: HugepageCount(0, 0, 0)},
            ),
        ],
        thp=Thp(enabled="madvise", available_enabled=["always", "madvise", "never"]),
        memory=MemoryPolicy(auto_online_blocks="offline", memory_block_size=128 * MiB),
        pci=[
            PciDevice(
                "0000:38:00.0",
                vendor=0x8086,
                class_code=0x050210,
                numa_node=0,
                kind="cxl",
                driver="cxl_pci",
                root_port="0000:37:01.0",
                link_speed="32.0 GT/s PCIe",
                link_width=16,
                max_link_speed="32.0 GT/s PCIe",
                max_link_width=16,
            ),
            PciDevice(
                "0000:18:00.0",
                vendor=0x10DE,
                class_code=0x030200,
                numa_node=0,
                kind="gpu",
                root_port="0000:17:00.0",
                link_speed="2.5 GT/s PCIe",
                link_width=16,
                max_link_speed="32.0 GT/s PCIe",
                max_link_width=16,
            ),
        ],
        root_ports=[
            RootPort(
                "0000:17:00.0",
                vendor=0x8086,
                perfctrlsts_0=0x00,
                perfctrlsts_1=0x01,
                config_readable=True,
                devices=["0000:18:00.0"],
            ),
            RootPort(
                "0000:37:01.0",
                vendor=0x8086,
                perfctrlsts_0=0x00,
                perfctrlsts_1=0x01,
                config_readable=True,
                devices=["0000:38:00.0"],
            ),
        ],
        cpu=CpuInfo(vendor="GenuineIntel", family=6, model=0x55, sockets=2),
        kernel=KernelInfo(release="6.8.0-45-generic", lockdown="none"),
        mtrr=[],
    )


def nocxl() -> HostSnapshot:
    return HostSnapshot(
        hostname="plain",
        tools=tools(),
        numa=[NumaNode(0, cpus=[0, 1], mem_total=8 * GiB, has_memory=True)],
        thp=Thp(enabled="madvise"),
        memory=MemoryPolicy(auto_online_blocks="online"),
        cpu=CpuInfo(vendor="GenuineIntel", family=6, model=0x8F),
        kernel=KernelInfo(release="6.1.0-28-amd64", lockdown="none"),
    )


def expectations(**changes: object) -> Expectations:
    base = Expectations(
        host_name="beluga-01",
        pool_size=POOL_SIZE,
        region_size=512 * MiB,
        align=2 * MiB,
        source="region",
        region_type="pmem",
        namespace_uuid=UUID,
        namespace_name="beluga-pool",
        interleave_ways=1,
        hosts_sharing=2,
        thp="madvise",
        ddio="disabled",
        pool_memory="write-back",
        cxl_nodes=0,
        gpus=1,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def ctx(snapshot: HostSnapshot, expect: Expectations | None = None) -> DoctorContext:
    return DoctorContext(snapshot, expect)
