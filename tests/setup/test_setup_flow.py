"""setup / teardown end to end on fake machines, through the real discovery readers and writers."""

from __future__ import annotations

import json

import pytest

from belugactl.errors import EnvironmentProblem
from belugactl.host.setup_state import SetupLocked, setup_lock
from belugactl.pool import header as hdr
from belugactl.workflows.setup.applier import ForceRequired, SetupFailed, run_setup, run_teardown
from belugactl.workflows.setup.topics.header import HeaderMismatch
from tests.support.fake_machine import FakeMachine, lab_target
from tests.support.pool_bytes import fingerprint, head

UUID = "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"


def snapshot_files(machine: FakeMachine) -> dict[str, bytes]:
    out = {}
    for path in sorted(machine.root.rglob("*")):
        if path.is_file() and not path.is_symlink() and "run/belugactl" not in str(path):
            out[str(path.relative_to(machine.root))] = path.read_bytes()
    return out


def test_fresh_host_plan_lists_exact_commands_in_order(lab1):
    plan = run_setup(lab1.host, lab_target(), dry_run=True).initial
    ids = [s.id for s in plan.steps]
    assert ids == ["region.create", "devdax.create", "permissions.dax", "header.write-or-verify",
                   "hugepages.node0", "thp.enabled"]
    region = plan.steps[0]
    assert region.actions[0].argv == ("cxl", "create-region", "-m", "-d", "decoder0.0", "-w", "1", "-t", "pmem",
                                      "-s", str(512 << 20), "mem0")
    assert [s.deferred for s in plan.steps] == [False, True, True, True, False, False]
    assert not plan.destructive
    assert {s.topic for s in plan.skipped} == {"ddio", "mtrr"}
    assert lab1.host.runner.calls and all(c[1] in ("version", "--version", "list") for c in lab1.host.runner.calls)


def test_setup_converges_and_second_run_has_zero_steps(lab1, pool_file):
    report = run_setup(lab1.host, lab_target())
    assert [o.step.id for o in report.applied] == [
        "region.create", "devdax.create", "permissions.dax", "header.write", "hugepages.node0", "thp.enabled"
    ]
    create_ns = report.applied[1].step.actions[0].argv
    assert create_ns == ("ndctl", "create-namespace", "-m", "devdax", "-M", "mem", "-a", "2M", "-u", UUID,
                         "-n", "beluga-lab", "-r", "region0")
    # The header is on the pool, valid, and what lab-1's manifest implies.
    data = head(pool_file, hdr.HEADER_REGION)
    header = hdr.PoolHeader.unpack(data)
    assert header.pool_uuid == UUID and header.created_by == "lab-1"
    assert hdr.diff(lab_target().header.ours, header) == []
    assert lab1.read("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages").strip() == "64"
    assert "[madvise]" in lab1.read("sys/kernel/mm/transparent_hugepage/enabled")
    assert 'KERNEL=="dax0.0"' in lab1.read("etc/udev/rules.d/60-belugactl-dax.rules")
    state = json.loads(lab1.read("var/lib/belugactl/state.json"))
    assert state["created"] == {"region": "region0", "namespace": "namespace0.0",
                                "udev_rule": "/etc/udev/rules.d/60-belugactl-dax.rules"}
    assert state["previous"]["hugepages"] == {"0": 0} and state["previous"]["thp"] == "always"

    calls_before = len(lab1.host.runner.calls)
    again = run_setup(lab1.host, lab_target())
    assert again.applied == [] and again.initial.converged
    assert all(c[1] in ("version", "--version", "list") for c in lab1.host.runner.calls[calls_before:])


def test_second_host_verifies_the_header_the_first_wrote(lab1, lab2, pool_file):
    run_setup(lab1.host, lab_target("lab-1"))
    written = head(pool_file, hdr.HEADER_REGION)
    plan = run_setup(lab2.host, lab_target("lab-2"), dry_run=True).initial
    assert "header.write-or-verify" in [s.id for s in plan.steps]
    report = run_setup(lab2.host, lab_target("lab-2"))
    # Once lab-2's device exists it reads lab-1's header, finds it matches, and plans no header write.
    assert "header" not in {o.step.topic for o in report.applied}
    assert {"region.create", "devdax.create"} <= {o.step.id for o in report.applied}
    assert head(pool_file, hdr.HEADER_REGION) == written
    assert run_setup(lab2.host, lab_target("lab-2")).applied == []


def test_second_host_with_another_layout_stops_before_touching_the_pool(lab1, lab2, pool_file):
    run_setup(lab1.host, lab_target("lab-1"))
    written = fingerprint(pool_file)
    other = lab_target("lab-2", edit={"slots_per_ring: 64": "slots_per_ring: 128"})
    with pytest.raises(SetupFailed) as err:
        run_setup(lab2.host, other)
    assert isinstance(err.value.cause, HeaderMismatch)
    assert "rpc_slots_per_ring: manifest 128, pool 64" in err.value.why
    assert fingerprint(pool_file) == written


def test_host_whose_layout_differs_is_refused_with_the_diff_and_nothing_changes(lab1, lab2, pool_file):
    run_setup(lab1.host, lab_target("lab-1"))
    run_setup(lab2.host, lab_target("lab-2"))
    other = lab_target("lab-2", edit={"shared_kv: 254MiB": "shared_kv: 200MiB"})
    before_pool = fingerprint(pool_file)
    before_files = snapshot_files(lab2)
    with pytest.raises(HeaderMismatch) as err:
        run_setup(lab2.host, other)
    fields = {row[0] for row in err.value.rows}
    assert {"layout_hash", "shared_kv_size"} <= fields
    assert "shared_kv_size" in err.value.why and "--force" in err.value.fix
    assert fingerprint(pool_file) == before_pool
    assert snapshot_files(lab2) == before_files


def test_force_rewrites_a_disagreeing_header_and_says_it_destroys_data(lab1, pool_file):
    run_setup(lab1.host, lab_target())
    other = lab_target(edit={"shared_kv: 254MiB": "shared_kv: 200MiB"})
    plan = run_setup(lab1.host, other, force=True, dry_run=True).initial
    assert [s.id for s in plan.destructive] == ["header.rewrite"]
    report = run_setup(lab1.host, other, force=True)
    assert [o.step.id for o in report.applied] == ["header.rewrite"]
    assert hdr.diff(other.header.ours, hdr.PoolHeader.unpack(head(pool_file, hdr.HEADER_REGION))) == []


def test_hugepage_shortfall_fails_with_the_reason_and_what_was_done(tmp_path, pool_file):
    machine = FakeMachine(tmp_path / "h", pool_file, hugepage_limit=10)
    with pytest.raises(SetupFailed) as err:
        run_setup(machine.host, lab_target())
    exc = err.value
    assert "reserved 10" in exc.what and "hugepages.node0" in exc.what
    assert "done: region.create, devdax.create, permissions.dax, header.write" in exc.why
    assert "not done: hugepages.node0, thp.enabled" in exc.why
    assert [s.id for s in exc.report.remaining] == ["hugepages.node0", "thp.enabled"]
    # Rerun continues from where the host is: only the two remaining steps are planned.
    machine.hugepage_limit = 1000
    report = run_setup(machine.host, lab_target())
    assert [o.step.id for o in report.applied] == ["hugepages.node0", "thp.enabled"]


def test_failing_tool_stops_setup_with_its_errno(lab1):
    lab1.state.fail["ndctl create-namespace"] = (256 - 28, "failed to create namespace: No space left on device")
    with pytest.raises(SetupFailed) as err:
        run_setup(lab1.host, lab_target())
    assert "ENOSPC" in err.value.why and "not enough free capacity" in err.value.why
    assert [o.step.id for o in err.value.report.applied] == ["region.create"]


def test_teardown_needs_force_then_restores_the_host(lab1, pool_file):
    pristine = snapshot_files(lab1)
    run_setup(lab1.host, lab_target())
    before = snapshot_files(lab1)
    with pytest.raises(ForceRequired) as err:
        run_teardown(lab1.host, lab_target())
    assert "devdax.destroy" in err.value.why and "region.destroy" in err.value.why
    assert snapshot_files(lab1) == before
    report = run_teardown(lab1.host, lab_target(), force=True)
    assert [o.step.id for o in report.applied] == [
        "thp.enabled", "hugepages.node0", "permissions.dax", "devdax.destroy", "region.destroy"
    ]
    after = snapshot_files(lab1)
    state = json.loads(after.pop("var/lib/belugactl/state.json"))
    assert state["created"] == {} and state["previous"] == {"hugepage_size": 2 << 20, "hugepages": {}}
    assert after == pristine
    assert lab1.state.regions == [] and lab1.state.namespaces == []
    assert run_teardown(lab1.host, lab_target(), force=True).applied == []


def test_a_second_setup_on_the_same_host_is_locked_out(lab1):
    with setup_lock(lab1.host), pytest.raises(SetupLocked) as err:
        run_setup(lab1.host, lab_target())
    assert "pid" in err.value.why
    assert lab1.state.regions == []


UNCACHABLE = {"pool_memory_type: write-back": "pool_memory_type: uncachable"}


def test_uncachable_pool_adds_aligned_mtrrs_and_teardown_removes_only_those(lab1):
    target = lab_target(edit=UNCACHABLE)
    report = run_setup(lab1.host, target)
    mtrr_step = next(o for o in report.applied if o.step.id == "mtrr.add")
    # region0 sits at 0x290000000, 512 MiB: aligned to 256 MiB only, so two MTRRs.
    assert [(a.base, a.size) for a in mtrr_step.step.actions] == [(0x290000000, 256 << 20), (0x2A0000000, 256 << 20)]
    assert set(lab1.mtrr) == {0, 1, 2}
    state = json.loads(lab1.read("var/lib/belugactl/state.json"))
    assert [m["reg"] for m in state["mtrr"]] == [1, 2]
    assert run_setup(lab1.host, target).applied == []
    run_teardown(lab1.host, target, force=True)
    assert set(lab1.mtrr) == {0}  # the firmware's entry stays


def test_too_few_free_mtrrs_is_refused_before_anything_changes(tmp_path, pool_file):
    machine = FakeMachine(tmp_path / "h", pool_file, variable_mtrrs=2)
    run_setup(machine.host, lab_target())
    before = snapshot_files(machine)
    with pytest.raises(EnvironmentProblem) as err:
        run_setup(machine.host, lab_target(edit=UNCACHABLE))
    assert "needs 2 MTRR(s); 1 of 2 are free" in err.value.what
    assert snapshot_files(machine) == before


def test_after_a_reboot_mtrrs_are_added_again_and_old_entries_forgotten(lab1):
    target = lab_target(edit=UNCACHABLE)
    run_setup(lab1.host, target)
    lab1.mtrr = {0: lab1.mtrr[0]}  # a reboot: the kernel forgot every entry the ASCII interface added
    lab1._render_mtrr()
    lab1.write("proc/sys/kernel/random/boot_id", "0b0e7c1e-0000-4000-8000-000000000002\n")
    report = run_setup(lab1.host, target, only=["mtrr"])
    assert [o.step.id for o in report.applied] == ["mtrr.add"]
    state = json.loads(lab1.read("var/lib/belugactl/state.json"))
    assert [m["reg"] for m in state["mtrr"]] == [1, 2]
    assert state["boot_id"].endswith("0002")


def test_ram_region_is_refused_on_ndctl_76_and_kernel_6_1(lab1):
    target = lab_target(edit={"type: pmem": "type: ram"})
    with pytest.raises(EnvironmentProblem) as err:
        run_setup(lab1.host, target, dry_run=True)
    assert "ndctl >= 77 and kernel >= 6.3" in err.value.why and "76.1" in err.value.why
