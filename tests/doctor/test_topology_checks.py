"""Software interleave zones against the devices, GPU-to-adapter locality, Intel DSA (issue 33 item 6)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from belugactl.host.host import Host
from belugactl.host.snapshot import CxlRegion, CxlState, DaxDevice
from belugactl.model.layout import Extent
from belugactl.units import GiB, TiB
from belugactl.workflows.discover import discover
from belugactl.workflows.doctor import Status, builtin_registry, run_doctor
from belugactl.workflows.doctor.checks.topology import zone_devices
from belugactl.workflows.doctor.expectations import from_manifest
from belugactl.workflows.rack_context import load_rack_context
from tests.fixtures.fixture_builder import TreeBuilder
from tests.support.doctor_snapshots import beluga_like, ctx

REPO = Path(__file__).resolve().parents[2]
BELUGA_RACK = REPO / "examples" / "beluga-rack.yaml"  # software interleave, 32 ways over 8 TiB
REGISTRY = builtin_registry()
BASE = 0x40000000000


def run(check_id: str, snapshot, expect=None):
    return REGISTRY.get(check_id).run(ctx(snapshot, expect))  # type: ignore[union-attr]


def beluga_expect(**changes):
    rack = load_rack_context(BELUGA_RACK)
    manifest = rack.manifest
    return replace(from_manifest(manifest, manifest.host("beluga-00"), layout=rack.layout), **changes)


def with_devices(memdevs: list[str]):
    """beluga_like with the 8 TiB pool's dax device on 32 single-device regions, end to end."""
    size = 256 * GiB
    regions = [
        CxlRegion(f"region{k}", resource=BASE + k * size, size=size, interleave_ways=1, memdevs=[m])
        for k, m in enumerate(memdevs)
    ]
    snap = beluga_like()
    dax = DaxDevice("dax0.0", size=8 * TiB, resource=BASE, mode="devdax")
    return replace(snap, cxl=CxlState(bus_present=True, memdevs=snap.cxl.memdevs, regions=regions), dax=[dax])


# --- interleave zones ---------------------------------------------------------------------------


def test_the_beluga_rack_layout_puts_each_zone_across_two_devices():
    # The shared KV area starts after the header, rings and journal (about 1 GiB), so zone k runs
    # from inside device k into device k+1: consecutive allocations do not land on distinct devices.
    result = run("pool.interleave-zones", beluga_like(), beluga_expect())
    assert result.status is Status.WARN
    assert "31 of 32 zones span two devices" in result.reason and "zone 0" in result.reason
    assert result.details["zones"][0]["devices"] == [0, 1]
    assert "device boundaries (256 GiB)" in result.fix


def test_zones_that_are_the_devices_are_ok_and_name_the_memdevs_in_order():
    names = [f"mem{k}" for k in range(32)]
    layout = SimpleNamespace(shared_kv=Extent(0, 8 * TiB))  # a KV area that is the whole pool
    result = run("pool.interleave-zones", with_devices(names), beluga_expect(layout=layout, dax_device="dax0.0"))
    assert result.status is Status.OK, result.reason
    assert result.details["memdevs"] == names
    assert all(z["devices"] == [k] for k, z in enumerate(result.details["zones"]))


def test_a_device_behind_two_slices_is_caught():
    names = [f"mem{k}" for k in range(32)]
    names[5] = "mem4"
    layout = SimpleNamespace(shared_kv=Extent(0, 8 * TiB))
    result = run("pool.interleave-zones", with_devices(names), beluga_expect(layout=layout, dax_device="dax0.0"))
    assert result.status is Status.WARN and "one device twice" in result.reason


def test_zone_devices_follow_the_allocator():
    layout = SimpleNamespace(shared_kv=Extent(2 * GiB, 4 * GiB))
    zones = zone_devices(layout, 2, 2 << 20, 4 * GiB)
    assert [sorted(d) for _, _, d in zones] == [[0], [1]]  # zone 0 = [2, 4) GiB, zone 1 = [4, 6) GiB


def test_hardware_interleave_skips():
    assert run("pool.interleave-zones", beluga_like(), None).status is Status.SKIP


# --- adapter locality -----------------------------------------------------------------------------


def test_a_gpu_on_a_node_without_an_adapter_warns():
    snap = beluga_like()
    assert run("pci.cxl-adapter-locality", snap).status is Status.OK
    pci = [replace(d, numa_node=1) if d.kind == "gpu" else d for d in snap.pci]
    result = run("pci.cxl-adapter-locality", replace(snap, pci=pci))
    assert result.status is Status.WARN
    assert result.details["remote_gpus"] == ["0000:18:00.0"] and "node(s) 1" in result.reason


def test_the_two_socket_fixture_has_one_adapter_per_socket():
    outcome = next(o for o in run_doctor(Host.from_tree(REPO / "tests/fixtures/beluga-intel")).outcomes
                   if o.id == "pci.cxl-adapter-locality")  # fmt: skip
    assert outcome.status is Status.OK
    assert outcome.result.details["adapters_per_node"] == {"0": ["0000:38:00.0"], "1": ["0000:b8:00.0"]}


# --- DSA ------------------------------------------------------------------------------------------


def _dsa_tree(root: Path) -> Host:
    """A fixture sysfs tree (built here): one DSA device and one other Intel platform function of the
    same class (not DSA), nothing else."""
    t = TreeBuilder(root)
    t.pci(["0000:6a:01.0"], "pci0000:6a", vendor=0x8086, device=0x0B25, class_code=0x088000, numa_node=0,
          driver="idxd")  # fmt: skip
    t.pci(["0000:00:08.0"], "pci0000:00", vendor=0x8086, device=0x09A2, class_code=0x088000, numa_node=0)
    return Host.from_tree(root)


def test_dsa_devices_are_discovered_by_id_and_noted(tmp_path):
    snap = discover(_dsa_tree(tmp_path), topics=("pci",))
    assert [(d.bdf, d.kind, d.driver) for d in snap.pci] == [("0000:6a:01.0", "dsa", "idxd")]
    result = run("pci.dsa-engines", replace(beluga_like(), pci=snap.pci))
    assert result.status is Status.OK and "4 KB" in result.reason and "docs/measurements.md" in result.reason
    assert run("pci.dsa-engines", beluga_like()).status is Status.SKIP
