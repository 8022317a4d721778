"""DDIO: the bit logic, the planner's choices per CPU, and the byte read-modify-write on config files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host
from belugactl.host.snapshot import CpuInfo, CxlMemdev, CxlState, HostSnapshot, KernelInfo, PciDevice, RootPort
from belugactl.host.write_pci import rmw_config_byte
from belugactl.model.setup_plan import PciConfigRmw
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import PoolTarget, SetupTarget
from belugactl.workflows.setup.topic import Planned
from belugactl.workflows.setup.topics import ddio as steps_ddio

CLX = CpuInfo(vendor="GenuineIntel", family=6, model=0x55)
CXL_RP, GPU_RP, OTHER_RP = "0000:34:00.0", "0000:17:00.0", "0000:80:00.0"


def target(ddio: str = "disabled") -> SetupTarget:
    return SetupTarget(host="h", pool=PoolTarget(source="cxl-region", size=1 << 30), ddio=ddio)


def snapshot(cpu: CpuInfo = CLX, pcs0: int = 0x91, pcs1: int = 0x00, lockdown: str = "none") -> HostSnapshot:
    ports = [RootPort(bdf, vendor=0x8086, perfctrlsts_0=pcs0, perfctrlsts_1=pcs1, config_readable=True)
             for bdf in (CXL_RP, GPU_RP, OTHER_RP)]
    return HostSnapshot(
        cpu=cpu,
        kernel=KernelInfo(lockdown=lockdown),
        cxl=CxlState(memdevs=[CxlMemdev("mem0", pmem_size=1 << 30, root_port=CXL_RP)]),
        pci=[PciDevice("0000:18:00.0", vendor=0x10DE, kind="gpu", root_port=GPU_RP),
             PciDevice("0000:81:00.0", vendor=0x8086, kind="nic", root_port=OTHER_RP)],
        root_ports=ports,
    )


def test_state_and_changes_follow_rpma_semantics():
    for pcs0 in range(256):
        for pcs1 in (0x00, 0x01, 0xFE, 0xFF):
            _check_bits(pcs0, pcs1)


def _check_bits(pcs0: int, pcs1: int) -> None:
    off = not pcs0 & 0x80 and not pcs0 & 0x08 and pcs1 & 0x01
    assert steps_ddio.ddio_state(pcs0, pcs1) == ("disabled" if off else "enabled")
    for want in ("disabled", "enabled"):
        new = {0x180: pcs0, 0x185: pcs1}
        for offset, clear, set_, cur in steps_ddio.wanted_changes(pcs0, pcs1, want):
            assert cur == new[offset]
            new[offset] = (cur & ~clear & 0xFF) | set_
        # Only the managed bits moved, and afterwards no change is wanted.
        assert new[0x180] & ~0x88 == pcs0 & ~0x88 and new[0x185] & ~0x01 == pcs1 & ~0x01
        assert steps_ddio.wanted_changes(new[0x180], new[0x185], want) == []
        if want == "disabled":
            assert steps_ddio.ddio_state(new[0x180], new[0x185]) == "disabled"
        else:
            assert new[0x180] & 0x80 and not new[0x185] & 0x01


def test_skylake_cascade_lake_plans_rmw_on_the_pool_and_gpu_root_ports_only():
    planned = steps_ddio.plan(target(), SetupFacts(snapshot()))
    steps, skipped = planned.steps, planned.skipped
    assert skipped == []
    assert [s.id for s in steps] == [f"ddio.{GPU_RP}", f"ddio.{CXL_RP}"]
    actions = steps[0].actions
    assert actions == (PciConfigRmw(GPU_RP, 0x180, 0x88, 0x00, 0x91), PciConfigRmw(GPU_RP, 0x185, 0x00, 0x01, 0x00))
    assert [a.new_value for a in actions] == [0x11, 0x01]
    assert steps[0].before == "enabled (0x180=0x91, 0x185=0x00)"
    converged = snapshot(pcs0=0x11, pcs1=0x01)
    assert steps_ddio.plan(target(), SetupFacts(converged)) == Planned()


@pytest.mark.parametrize(
    ("cpu", "reason"),
    [
        (CpuInfo(vendor="AuthenticAMD", family=25, model=1), "AuthenticAMD"),
        (replace(CLX, model=0x6A), "Ice Lake"),
        (replace(CLX, model=0x8F), "Sapphire Rapids"),
        (replace(CLX, model=0x3F), "no documented DDIO register layout"),
    ],
)
def test_other_cpus_are_skipped_with_the_reason(cpu, reason):
    planned = steps_ddio.plan(target(), SetupFacts(snapshot(cpu=cpu)))
    steps, skipped = planned.steps, planned.skipped
    assert steps == [] and len(skipped) == 1 and reason in skipped[0].reason


def test_unmanaged_is_left_alone():
    planned = steps_ddio.plan(target("unmanaged"), SetupFacts(snapshot()))
    steps, skipped = planned.steps, planned.skipped
    assert steps == [] and skipped[0].reason == "caching.ddio is unmanaged"


def test_lockdown_is_a_clear_environment_error():
    with pytest.raises(EnvironmentProblem) as err:
        steps_ddio.plan(target(), SetupFacts(snapshot(lockdown="integrity")))
    assert "lockdown" in err.value.what and "BIOS" in err.value.fix


def _config(tmp_path: Path, bdf: str, pcs0: int, pcs1: int) -> Host:
    config = tmp_path / f"sys/bus/pci/devices/{bdf}/config"
    config.parent.mkdir(parents=True)
    data = bytearray(range(256)) * 16  # 4096 bytes of recognisable content
    data[0x180], data[0x185] = pcs0, pcs1
    config.write_bytes(bytes(data))
    return Host(tmp_path)


def test_rmw_changes_only_the_named_bits(tmp_path):
    host = _config(tmp_path, GPU_RP, 0x91, 0x00)
    original = host.read_bytes(f"/sys/bus/pci/devices/{GPU_RP}/config")
    assert rmw_config_byte(host, GPU_RP, 0x180, clear_bits=0x88, set_bits=0, expect=0x91) == (0x91, 0x11)
    after = host.read_bytes(f"/sys/bus/pci/devices/{GPU_RP}/config")
    assert after[0x180] == 0x11
    assert after[:0x180] == original[:0x180] and after[0x181:] == original[0x181:]


def test_rmw_refuses_when_the_byte_changed_since_planning(tmp_path):
    host = _config(tmp_path, GPU_RP, 0x95, 0x00)
    with pytest.raises(StepFailed) as err:
        rmw_config_byte(host, GPU_RP, 0x180, clear_bits=0x88, set_bits=0, expect=0x91)
    assert "changed since planning" in err.value.what
    assert host.read_bytes(f"/sys/bus/pci/devices/{GPU_RP}/config", 1, 0x180) == b"\x95"


def test_teardown_restores_exactly_the_saved_bits():
    from belugactl.workflows.setup.planner import plan_teardown

    state = {"version": 1, "created": {}, "mtrr": [], "boot_id": None,
             "previous": {"ddio": {GPU_RP: {"0x180": 0x91, "0x185": 0x00}}}}
    facts = SetupFacts(snapshot(pcs0=0x15, pcs1=0x01), state=state)  # bit 2 changed by someone else since
    plan = plan_teardown(target(), facts)
    step = next(s for s in plan.steps if s.id == f"ddio.{GPU_RP}")
    assert step.actions == (
        PciConfigRmw(GPU_RP, 0x180, 0x08, 0x80, 0x15),
        PciConfigRmw(GPU_RP, 0x185, 0x01, 0x00, 0x01),
    )
    assert [a.new_value for a in step.actions] == [0x95, 0x00]  # managed bits restored, bit 2 left alone


@pytest.mark.parametrize("model", [0x8F, 0x6A, 0x3F])
def test_doctor_says_what_setup_says_where_setup_leaves_ddio_to_the_bios(model):
    from belugactl.workflows.doctor import builtin_registry
    from belugactl.workflows.doctor.context import DoctorContext

    snap = replace(snapshot(cpu=replace(CLX, model=model)), cxl=CxlState(
        bus_present=True, memdevs=[CxlMemdev("mem0", pmem_size=1 << 30, root_port=CXL_RP)]))
    skip = steps_ddio.plan(target(), SetupFacts(snap)).skipped[0].reason
    fix = builtin_registry().get("ddio.disabled").run(DoctorContext(snap, None)).fix
    assert fix.startswith(skip) and "BIOS" in skip
    assert "`belugactl setup` skips DDIO on this CPU" in fix and "belugactl setup -f" not in fix


def test_doctor_points_at_setup_where_setup_writes_the_bits():
    from belugactl.workflows.doctor import builtin_registry
    from belugactl.workflows.doctor.context import DoctorContext

    snap = replace(snapshot(), cxl=CxlState(
        bus_present=True, memdevs=[CxlMemdev("mem0", pmem_size=1 << 30, root_port=CXL_RP)]))
    assert steps_ddio.plan(target(), SetupFacts(snap)).steps  # setup plans the writes on Cascade Lake
    fix = builtin_registry().get("ddio.disabled").run(DoctorContext(snap, None)).fix
    assert f"setpci -s {GPU_RP} 180.b=00:88" in fix and "belugactl setup -f MANIFEST" in fix
