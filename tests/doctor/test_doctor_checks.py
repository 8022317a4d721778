"""Each check against snapshots built in code: one fact changed, the check that should notice does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from belugactl.host.snapshot import (
    CpuInfo,
    DaxDevice,
    HugepageCount,
    KernelInfo,
    MemoryPolicy,
    MtrrEntry,
    NumaNode,
    RootPort,
    ToolInfo,
)
from belugactl.units import GiB, MiB
from belugactl.workflows.doctor import CheckResult, Status, builtin_registry
from belugactl.workflows.doctor.context import HugepageWant
from tests.support.doctor_snapshots import CXL_NODE, POOL_SIZE, REGION_BASE, beluga_like, ctx, expectations, nocxl

REGISTRY = builtin_registry()


def run(check_id: str, snapshot, expect=None) -> CheckResult:
    check = REGISTRY.get(check_id)
    assert check is not None, check_id
    return check.run(ctx(snapshot, expect))


def with_dax(snapshot, **changes):
    return replace(snapshot, dax=[replace(snapshot.dax[0], **changes)])


def with_ports(snapshot, p0: int | None, p1: int | None):
    return replace(snapshot, root_ports=[replace(p, perfctrlsts_0=p0, perfctrlsts_1=p1) for p in snapshot.root_ports])


# --- a healthy host is healthy ----------------------------------------------------------------


def test_healthy_host_has_no_failures_with_or_without_manifest():
    for expect in (None, expectations()):
        results = {c.id: c.run(ctx(beluga_like(), expect)) for c in REGISTRY}
        bad = {i: r.reason for i, r in results.items() if r.status in (Status.FAIL, Status.WARN)}
        assert bad == {}, bad


def test_no_cxl_host_skips_every_cxl_check_and_says_why():
    for check_id in (
        "kernel.cxl-bus",
        "cxl.memdevs-present",
        "cxl.region-committed",
        "dax.mode-devdax",
        "dax.map-mem",
        "numa.cxl-node-cpuless",
        "memory.auto-online",
        "pool.header",
    ):
        result = run(check_id, nocxl())
        assert result.status is Status.SKIP, (check_id, result)
        assert "no CXL" in result.reason, (check_id, result.reason)


# --- the traps the references describe ---------------------------------------------------------


def test_dax_onlined_as_system_ram_fails_with_the_reconfigure_fix():
    snap = with_dax(beluga_like(), mode="system-ram", dev_exists=False, online_memblocks=4, total_memblocks=4)
    result = run("dax.mode-devdax", snap)
    assert result.status is Status.FAIL
    assert "system-ram" in result.reason and "zero" in result.reason
    assert "daxctl reconfigure-device --mode=devdax --force dax0.0" in result.fix
    # the missing /dev node is a consequence, reported once (as a skip pointing at the cause)
    present = run("dax.device-present", snap, expectations())
    assert present.status is Status.SKIP and "dax.mode-devdax" in present.reason


def test_map_dev_fails_on_a_shared_pool_and_warns_on_a_single_host():
    snap = beluga_like()
    snap = replace(snap, nd=replace(snap.nd, namespaces=[replace(snap.nd.namespaces[0], map="dev")]))
    shared = run("dax.map-mem", snap, expectations(hosts_sharing=16))
    assert shared.status is Status.FAIL
    assert "16 hosts" in shared.reason
    assert "-M mem" in shared.fix and "--reconfig=namespace0.0" in shared.fix
    alone = run("dax.map-mem", snap, expectations(hosts_sharing=1))
    assert alone.status is Status.WARN


@pytest.mark.parametrize("policy", ["online", "online_movable", "online_kernel"])
def test_auto_online_policy_that_onlines_memory_fails(policy):
    snap = replace(beluga_like(), memory=MemoryPolicy(auto_online_blocks=policy))
    result = run("memory.auto-online", snap)
    assert result.status is Status.FAIL
    assert policy in result.reason
    assert "echo offline > /sys/devices/system/memory/auto_online_blocks" in result.fix
    assert "memhp_default_state=offline" in result.fix


def test_auto_online_offline_is_ok():
    assert run("memory.auto-online", beluga_like()).status is Status.OK


def test_cxl_node_is_reported_as_discovered_not_assumed():
    result = run("numa.cxl-node-discovered", beluga_like())
    assert result.status is Status.OK
    assert f"node {CXL_NODE}" in result.reason
    assert result.details["nodes"] == [CXL_NODE]
    other = with_dax(beluga_like(), target_node=3)
    other = replace(other, nd=replace(other.nd, regions=[replace(other.nd.regions[0], target_node=3)]))
    assert run("numa.cxl-node-discovered", other).details["nodes"] == [3]


def test_cxl_node_with_cpus_fails_and_cpuless_online_node_is_ok():
    snap = beluga_like()
    with_cpus = replace(snap, numa=[*snap.numa, NumaNode(CXL_NODE, cpus=[16, 17, 18, 20], has_memory=True)])
    result = run("numa.cxl-node-cpuless", with_cpus)
    assert result.status is Status.FAIL
    assert f"node {CXL_NODE} has CPUs 16-18,20" in result.reason
    cpuless = replace(snap, numa=[*snap.numa, NumaNode(CXL_NODE, cpus=[], mem_total=GiB, has_memory=True)])
    assert run("numa.cxl-node-cpuless", cpuless).status is Status.OK
    # the manifest's count of online CXL memory nodes is compared with what was found
    assert run("numa.cxl-node-discovered", cpuless, expectations(cxl_nodes=1)).status is Status.OK
    assert run("numa.cxl-node-discovered", cpuless, expectations(cxl_nodes=0)).status is Status.WARN


def test_ddio_on_at_a_gpu_root_port_fails_with_setpci_fix():
    snap = with_ports(beluga_like(), 0x80, 0x00)
    result = run("ddio.disabled", snap)
    assert result.status is Status.FAIL
    assert "0000:17:00.0" in result.reason and "0000:37:01.0" in result.reason
    assert "setpci -s 0000:17:00.0 180.b=00:88" in result.fix
    assert "setpci -s 0000:17:00.0 185.b=01:01" in result.fix
    assert "no manifest" in result.reason


def test_ddio_partially_off_warns_and_fully_off_is_ok():
    assert run("ddio.disabled", with_ports(beluga_like(), 0x00, 0x00)).status is Status.WARN  # TPHDIS clear
    assert run("ddio.disabled", with_ports(beluga_like(), 0x08, 0x01)).status is Status.WARN  # NoSnoopOpWrEn set
    assert run("ddio.disabled", with_ports(beluga_like(), 0x00, 0x01)).status is Status.OK


def test_ddio_only_checks_ports_in_front_of_gpus_and_adapters():
    snap = beluga_like()
    unrelated = RootPort("0000:00:1c.0", vendor=0x8086, perfctrlsts_0=0x80, perfctrlsts_1=0)
    assert run("ddio.disabled", replace(snap, root_ports=[*snap.root_ports, unrelated])).status is Status.OK


def test_ddio_skips_on_amd_and_when_unmanaged_and_warns_when_unreadable():
    amd = replace(with_ports(beluga_like(), 0x80, 0), cpu=CpuInfo(vendor="AuthenticAMD", family=25))
    result = run("ddio.disabled", amd)
    assert result.status is Status.SKIP and "AuthenticAMD" in result.reason
    unmanaged = run("ddio.disabled", with_ports(beluga_like(), 0x80, 0), expectations(ddio="unmanaged"))
    assert unmanaged.status is Status.SKIP and "unmanaged" in unmanaged.reason
    unreadable = run("ddio.disabled", with_ports(beluga_like(), None, None))
    assert unreadable.status is Status.WARN and "0x180" in unreadable.reason and "root" in unreadable.fix
    no_ecam = with_ports(beluga_like(), None, None)
    no_ecam = replace(no_ecam, root_ports=[replace(p, config_size=256) for p in no_ecam.root_ports])
    result = run("ddio.disabled", no_ecam)
    assert result.status is Status.WARN and "first 256 bytes" in result.reason and "ECAM" in result.fix


def test_ddio_on_newer_cpu_points_at_the_bios():
    snap = replace(with_ports(beluga_like(), 0x80, 0), cpu=CpuInfo(vendor="GenuineIntel", family=6, model=0x8F))
    assert "BIOS" in run("ddio.disabled", snap).fix


def test_lockdown_blocking_the_ddio_write_fails():
    snap = replace(with_ports(beluga_like(), 0x80, 0), kernel=KernelInfo(release="6.8.0", lockdown="integrity"))
    result = run("kernel.lockdown", snap)
    assert result.status is Status.FAIL
    assert "integrity" in result.reason and "PCI config-space" in result.reason
    assert "BIOS" in result.fix
    assert "lockdown blocks" in run("ddio.disabled", snap).fix
    # nothing to write: lockdown does not matter
    done = replace(beluga_like(), kernel=KernelInfo(release="6.8.0", lockdown="confidentiality"))
    assert run("kernel.lockdown", done).status is Status.OK
    amd = replace(snap, cpu=CpuInfo(vendor="AuthenticAMD"))
    assert run("kernel.lockdown", amd).status is Status.OK
    partial = replace(with_ports(beluga_like(), 0x00, 0x00), kernel=KernelInfo(release="6.8.0", lockdown="integrity"))
    assert run("kernel.lockdown", partial).status is Status.FAIL  # TPHDIS still has to be written
    plain = replace(nocxl(), kernel=KernelInfo(release="6.1.0", lockdown="integrity"))
    result = run("kernel.lockdown", plain)
    assert result.status is Status.OK and "nothing this host needs" in result.reason


# --- manifest comparisons ----------------------------------------------------------------------


def test_namespace_identity_is_compared_with_the_pinned_values():
    other_uuid = "00000000-0000-4000-8000-000000000001"
    uuid = run("dax.namespace-uuid", beluga_like(), expectations(namespace_uuid=other_uuid))
    assert uuid.status is Status.FAIL and other_uuid in uuid.reason
    assert f"-u {other_uuid}" in uuid.fix
    name = run("dax.namespace-name", beluga_like(), expectations(namespace_name="other"))
    assert name.status is Status.FAIL
    assert run("dax.namespace-uuid", beluga_like(), expectations()).status is Status.OK
    assert run("dax.namespace-uuid", beluga_like()).status is Status.SKIP


def _with_namespace(snap, **changes):
    ns = replace(snap.nd.namespaces[0], **changes)
    return replace(snap, nd=replace(snap.nd, namespaces=[ns]))


def test_namespace_uuid_compares_the_label_uuid_not_the_info_block_uuid():
    snap = beluga_like()
    ns = snap.nd.namespaces[0]
    assert ns.uuid != ns.label_uuid  # devdax: ndctl's uuid is the info block's
    ok = run("dax.namespace-uuid", snap, expectations(namespace_uuid=ns.label_uuid.upper()))
    assert ok.status is Status.OK and "label uuid" in ok.reason
    # the info-block uuid matching the pin means nothing once the label uuid is known
    wrong = run("dax.namespace-uuid", snap, expectations(namespace_uuid=ns.uuid))
    assert wrong.status is Status.FAIL and ns.label_uuid in wrong.reason


def test_namespace_uuid_without_a_label_uuid_falls_back_and_says_so():
    unknown = _with_namespace(beluga_like(), label_uuid=None)
    ns = unknown.nd.namespaces[0]
    # devdax: a differing ndctl uuid proves nothing, so it warns and names where to look
    warn = run("dax.namespace-uuid", unknown, expectations())
    assert warn.status is Status.WARN and "label uuid unknown" in warn.reason
    assert f"/sys/bus/nd/devices/{ns.dev}/uuid" in warn.fix
    same = run("dax.namespace-uuid", unknown, expectations(namespace_uuid=ns.uuid))
    assert same.status is Status.OK and "label uuid unknown" in same.reason
    # a raw namespace has no info block: its ndctl uuid is the label's, so a difference fails
    raw = _with_namespace(unknown, mode="raw")
    failed = run("dax.namespace-uuid", raw, expectations())
    assert failed.status is Status.FAIL and "label uuid unknown" in failed.reason


def test_dax_size_against_the_manifest():
    assert run("dax.size-matches-manifest", beluga_like(), expectations()).status is Status.OK
    small = run("dax.size-matches-manifest", beluga_like(), expectations(pool_size=POOL_SIZE + 2 * MiB))
    assert small.status is Status.FAIL and f"pool.size: {POOL_SIZE}" in small.fix
    big = run("dax.size-matches-manifest", beluga_like(), expectations(pool_size=POOL_SIZE - 2 * MiB))
    assert big.status is Status.WARN


def test_a_pool_past_the_cpus_physical_address_width_fails():
    snap = beluga_like()
    narrow = replace(snap, cpu=replace(snap.cpu, phys_address_bits=40))  # 1 TiB, as QEMU's default CPU
    failed = run("dax.size-matches-manifest", narrow, expectations(pool_size=(1 << 40) + 2 * MiB))
    assert failed.status is Status.FAIL and "40-bit physical address space" in failed.reason
    assert run("dax.size-matches-manifest", narrow, expectations()).status is Status.OK  # POOL_SIZE fits


def test_dax_align_against_the_manifest_and_the_2mib_default():
    assert run("dax.align", beluga_like(), expectations(align=GiB)).status is Status.FAIL
    small = with_dax(beluga_like(), align=4096)
    result = run("dax.align", small, expectations(align=None))
    assert result.status is Status.WARN and "-a 2M" in result.fix


@pytest.mark.parametrize(
    ("mode", "status"), [(0o666, Status.FAIL), (0o662, Status.FAIL), (0o644, Status.WARN), (0o660, Status.OK)]
)
def test_dax_permissions(mode, status):
    result = run("dax.permissions", with_dax(beluga_like(), dev_mode=0o20000 | mode), expectations())
    assert result.status is status
    assert f"{mode:04o}" in result.reason
    if status is not Status.OK:
        assert "chmod 0660 /dev/dax0.0" in result.fix and "udev" in result.fix


def test_dax_permissions_against_the_manifests_pool_permissions():
    # beluga_like's node is root:beluga (uid 0, gid 990) 0660
    want = {"dev_owner": "root", "dev_group": "beluga", "dev_mode": 0o660}
    ok = run("dax.permissions", beluga_like(), expectations(**want))
    assert ok.status is Status.OK and "as pool.permissions says" in ok.reason
    numeric = run("dax.permissions", beluga_like(), expectations(dev_owner="0", dev_group="990", dev_mode=0o660))
    assert numeric.status is Status.OK
    group = run("dax.permissions", beluga_like(), expectations(**{**want, "dev_group": "root"}))
    assert group.status is Status.FAIL and "group beluga, not root" in group.reason
    assert "belugactl setup" in group.fix and "chown root:root /dev/dax0.0" in group.fix
    tighter = run("dax.permissions", with_dax(beluga_like(), dev_mode=0o20000 | 0o600), expectations(**want))
    assert tighter.status is Status.FAIL and "mode 0600, not 0660" in tighter.reason
    assert "chmod 0660 /dev/dax0.0" in tighter.fix
    # world-writable fails whatever the manifest says
    open_node = run("dax.permissions", with_dax(beluga_like(), dev_mode=0o20000 | 0o666), expectations(**want))
    assert open_node.status is Status.FAIL and "world-writable" in open_node.reason


def test_hugepages_per_node_shortfall_names_the_sysfs_file():
    want = (HugepageWant(0, 2 * MiB, 1024), HugepageWant(1, 2 * MiB, 512))
    result = run("hugepages.per-node", beluga_like(), expectations(hugepages=want))
    assert result.status is Status.FAIL
    assert "node 1: 0/512" in result.reason
    assert "echo 512 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages" in result.fix
    assert "node 0" not in result.fix
    missing = run("hugepages.per-node", beluga_like(), expectations(hugepages=(HugepageWant(7, 2 * MiB, 1),)))
    assert missing.status is Status.FAIL and "7" in missing.reason
    ok = run("hugepages.per-node", beluga_like(), expectations(hugepages=(HugepageWant(0, 2 * MiB, 1024),)))
    assert ok.status is Status.OK


def test_hugepages_pinned_on_the_cxl_node_fail_as_an_assumed_node_number():
    want = (HugepageWant(0, 2 * MiB, 1024), HugepageWant(CXL_NODE, 2 * MiB, 64))
    snap = beluga_like()
    snap = replace(snap, numa=[*snap.numa, NumaNode(CXL_NODE, cpus=[], has_memory=True)])
    result = run("hugepages.per-node", snap, expectations(hugepages=want))
    assert result.status is Status.FAIL
    assert f"node(s) {CXL_NODE}" in result.reason and "never pinned" in result.reason


def test_thp_mode_against_the_manifest():
    result = run("thp.mode", beluga_like(), expectations(thp="always"))
    assert result.status is Status.FAIL
    assert "echo always > /sys/kernel/mm/transparent_hugepage/enabled" in result.fix
    assert run("thp.mode", beluga_like(), expectations(thp="madvise")).status is Status.OK
    never = replace(beluga_like(), thp=replace(beluga_like().thp, enabled="never"))
    assert run("thp.mode", never).status is Status.WARN


def test_mtrr_only_when_the_manifest_asks_for_uncachable():
    assert run("mtrr.pool-uncachable", beluga_like(), expectations()).status is Status.SKIP
    uc = expectations(pool_memory="uncachable")
    result = run("mtrr.pool-uncachable", beluga_like(), uc)
    assert result.status is Status.FAIL
    # the dax device starts 2 MiB into the region: 2 MiB, 4 MiB, 8 MiB ... pieces, each size-aligned
    assert f'echo "base=0x{REGION_BASE + 2 * MiB:x} size=0x200000 type=uncachable" > /proc/mtrr' in result.fix
    covered = replace(beluga_like(), mtrr=[MtrrEntry(0, REGION_BASE, GiB, "uncachable")])
    assert run("mtrr.pool-uncachable", covered, uc).status is Status.OK
    write_back = replace(beluga_like(), mtrr=[MtrrEntry(0, REGION_BASE, GiB, "write-back")])
    assert run("mtrr.pool-uncachable", write_back, uc).status is Status.FAIL
    absent = replace(beluga_like(), mtrr=None)
    assert "/proc/mtrr is absent" in run("mtrr.pool-uncachable", absent, uc).reason


def test_mtrr_shortage_is_a_failure_of_its_own(tmp_path):
    from belugactl.host.host import Host
    from belugactl.workflows.doctor import DoctorContext

    msr = tmp_path / "dev" / "cpu" / "0" / "msr"
    msr.parent.mkdir(parents=True)
    msr.write_bytes(bytes(0xFE) + (0x508).to_bytes(8, "little"))  # IA32_MTRRCAP: VCNT 8 (low byte)
    used = [MtrrEntry(i, (i + 1) << 32, 1 << 20, "write-back") for i in range(6)]
    snap = replace(beluga_like(), mtrr=used)
    uc = expectations(pool_memory="uncachable")
    check = REGISTRY.get("mtrr.pool-uncachable")
    result = check.run(DoctorContext(snap, uc, Host(tmp_path)))
    # a 510 MiB pool 2 MiB into a 1 GiB-aligned region needs 8 power-of-two pieces; 2 of 8 registers are free
    assert result.status is Status.FAIL
    assert "takes 8 MTRR(s) while only 2 of 8 are free" in result.reason
    assert result.details["variable_mtrrs"] == 8
    plenty = check.run(DoctorContext(replace(snap, mtrr=[]), uc, Host(tmp_path)))
    assert "while only" not in plenty.reason


def test_region_checks():
    snap = beluga_like()
    reset = replace(snap, cxl=replace(snap.cxl, regions=[replace(snap.cxl.regions[0], decode_state="reset")]))
    result = run("cxl.region-committed", reset)
    assert result.status is Status.FAIL and "cxl destroy-region -f region0" in result.fix
    none = replace(snap, cxl=replace(snap.cxl, regions=[]))
    assert run("cxl.region-committed", none, expectations()).status is Status.FAIL
    assert run("cxl.region-committed", none).status is Status.WARN
    geometry = run("cxl.region-geometry", snap, expectations(interleave_ways=2, region_type="ram"))
    assert geometry.status is Status.FAIL and "manifest says 2" in geometry.reason and "ram" in geometry.reason


def test_memdev_serials_from_the_manifest():
    assert run("cxl.memdevs-present", beluga_like(), expectations(memdev_serials=(0x1234,))).status is Status.OK
    missing = run("cxl.memdevs-present", beluga_like(), expectations(memdev_serials=(0x1234, 0x99)))
    assert missing.status is Status.FAIL and "0x99" in missing.reason


def test_tools_missing_on_a_cxl_host_fail_and_ram_regions_need_ndctl_77():
    snap = replace(beluga_like(), tools={"cxl": ToolInfo("cxl")})
    result = run("tools.ndctl-present", snap)
    assert result.status is Status.FAIL and "apt-get install ndctl" in result.fix
    assert run("tools.ndctl-present", nocxl().__class__(tools={})).status is Status.SKIP
    ram = expectations(region_type="ram")
    assert run("tools.ndctl-version", beluga_like(), ram).status is Status.FAIL
    assert run("kernel.version", beluga_like(), ram).status is Status.OK  # 6.8 >= 6.3
    old = replace(beluga_like(), kernel=KernelInfo(release="6.1.0-28-amd64", lockdown="none"))
    assert run("kernel.version", old, ram).status is Status.FAIL
    assert run("tools.ndctl-version", beluga_like(), expectations()).status is Status.OK


def test_gpu_checks():
    snap = beluga_like()
    unknown = replace(snap, pci=[replace(d, numa_node=None) if d.kind == "gpu" else d for d in snap.pci])
    assert run("gpu.numa-locality", unknown).status is Status.WARN
    assert run("gpu.count", snap, expectations(gpus=8)).status is Status.FAIL
    degraded = replace(snap, pci=[replace(d, link_width=8) if d.kind == "cxl" else d for d in snap.pci])
    result = run("pci.link-trained", degraded)
    assert result.status is Status.WARN and "x8 of x16" in result.reason
    # an idle GPU's lower link speed is normal and not reported
    assert run("pci.link-trained", snap).status is Status.OK


def test_decoder_capacity_for_a_pool_not_built_yet():
    snap = beluga_like()
    free = replace(
        snap,
        cxl=replace(
            snap.cxl,
            regions=[],
            root_decoders=[replace(snap.cxl.root_decoders[0], region=None, max_available_extent=256 * MiB)],
        ),
    )
    result = run("cxl.decoder-capacity", free, expectations())
    assert result.status is Status.FAIL and "512 MiB" in result.reason


def test_cxl_adapter_without_its_driver_fails_kernel_cxl_bus():
    snap = beluga_like()
    unbound = replace(snap, pci=[replace(d, driver=None) if d.kind == "cxl" else d for d in snap.pci])
    result = run("kernel.cxl-bus", unbound)
    assert result.status is Status.FAIL and "0000:38:00.0 (no driver)" in result.reason
    assert "modprobe -a cxl_acpi cxl_pci" in result.fix
    no_bus = replace(unbound, cxl=replace(snap.cxl, bus_present=False))
    assert "drivers are not loaded" in run("kernel.cxl-bus", no_bus).reason
    assert run("kernel.cxl-bus", snap).status is Status.OK


def test_discovery_problems_are_surfaced():
    snap = replace(beluga_like(), problems=["cxl list: not JSON"])
    result = run("discover.complete", snap)
    assert result.status is Status.WARN and "cxl list: not JSON" in result.reason


def test_pool_dax_is_found_by_physical_range_even_with_other_dax_devices():
    snap = beluga_like()
    hmem = DaxDevice("dax1.0", size=GiB, resource=0x100000000, mode="system-ram")
    snap = replace(snap, dax=[*snap.dax, hmem], nd=replace(snap.nd, namespaces=[]))
    c = ctx(snap, expectations())
    assert [d.name for d in c.cxl_dax_devices()] == ["dax0.0"]
    assert c.pool_dax().name == "dax0.0"
    # the non-CXL system-ram device is not the pool's problem
    assert run("dax.mode-devdax", snap).status is Status.OK


def test_hugepages_of_another_size_do_not_count():
    snap = replace(beluga_like(), numa=[NumaNode(0, cpus=[0], hugepages={GiB: HugepageCount(4, 4, 0)})])
    result = run("hugepages.per-node", snap, expectations(hugepages=(HugepageWant(0, 2 * MiB, 4),)))
    assert result.status is Status.FAIL


POOL_DEVICE_CHECKS = (
    "dax.device-present", "dax.map-mem", "dax.align", "dax.permissions", "pool.header"
)


@pytest.mark.parametrize("check_id", POOL_DEVICE_CHECKS)
def test_without_a_manifest_the_pool_device_checks_skip_and_never_guess_dax0_0(check_id):
    # beluga_like has exactly one CXL dax device, dax0.0: the old code took it for the pool.
    snap = with_dax(beluga_like(), dev_mode=0o20000 | 0o666, align=4096)
    assert ctx(snap).pool_dax() is None
    result = run(check_id, snap)
    assert result.status is Status.SKIP, result
    assert "no manifest names the pool's dax device" in result.reason and "-f rack.yaml" in result.fix
    assert "dax0.0" not in result.reason
    # With a manifest the same device is the pool and is judged (wrong mode and align fail or warn).
    if check_id in ("dax.align", "dax.permissions"):
        assert run(check_id, snap, expectations()).status in (Status.FAIL, Status.WARN)
