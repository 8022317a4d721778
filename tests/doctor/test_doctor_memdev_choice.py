"""Doctor's cxl.memdevs-present with a manifest that chooses memdevs by switch and count.

It makes setup's choice (belugactl.workflows.memdev_choice), so it fails where setup would refuse,
naming the selector and every memdev found with its serial and switch.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from belugactl.cli.app import run
from belugactl.host.host import Host
from belugactl.host.snapshot import CxlMemdev
from belugactl.units import GiB
from belugactl.workflows.doctor import Status, builtin_registry, run_doctor
from belugactl.workflows.rack_context import load_rack_context
from tests.support.doctor_snapshots import beluga_like, ctx, expectations

REPO = Path(__file__).resolve().parents[2]
FRESH = REPO / "tests" / "fixtures" / "ram-fresh"
SWITCHED = REPO / "tests" / "manifests" / "lab-ram-switch.yaml"
SW = "0000:0d:00.0"


def _check(snapshot, expect):
    check = builtin_registry().get("cxl.memdevs-present")
    assert check is not None
    return check.run(ctx(snapshot, expect))


def _switched_host(*memdevs: CxlMemdev):
    snap = beluga_like()
    return replace(snap, cxl=replace(snap.cxl, memdevs=list(memdevs)))


def _ram(name: str, serial: int, switch: str | None, state: str = "enabled") -> CxlMemdev:
    return CxlMemdev(name, serial=serial, ram_size=GiB, pmem_size=0, state=state, switch=switch,
                     root_port="0000:0c:00.0")


def test_ok_names_the_chosen_memdevs_in_position_order():
    snap = _switched_host(_ram("mem0", 0x11, SW), _ram("mem1", 0x10, SW), _ram("mem2", 0x12, SW))
    result = _check(snap, expectations(region_type="ram", memdev_switch="any", memdev_count=2))
    assert result.status is Status.OK
    assert result.details["chosen"] == ["mem1", "mem0"]
    assert "the first 2 by serial behind the one switch this host has picks, in interleave order" in result.reason
    assert f"mem1 (0x10, behind switch {SW}, 1 GiB ram), mem0 (0x11" in result.reason
    assert "not chosen: mem2" in result.reason


def test_fails_with_the_facts_when_the_switch_is_absent():
    snap = _switched_host(_ram("mem0", 0x11, SW), _ram("mem1", 0x10, SW))
    result = _check(snap, expectations(region_type="ram", memdev_switch="0000:55:00.0"))
    assert result.status is Status.FAIL
    assert "no memdev on this host is behind switch 0000:55:00.0" in result.reason
    assert f"mem1 (0x10, behind switch {SW}, 1 GiB ram); mem0 (0x11, behind switch {SW}, 1 GiB ram)" in result.reason
    assert f"the switches this host sees: {SW}" in result.fix


def test_fails_when_count_is_more_than_present():
    snap = _switched_host(_ram("mem0", 0x11, SW), _ram("mem1", 0x10, SW, state="disabled"))
    result = _check(snap, expectations(region_type="ram", memdev_count=2))
    assert result.status is Status.FAIL
    assert "count is 2, but this host has 1 enabled memdev(s) with ram capacity" in result.reason
    assert "mem1 (0x10, behind switch 0000:0d:00.0, 1 GiB ram, disabled)" in result.reason


def test_fails_when_any_meets_no_switch():
    result = _check(beluga_like(), expectations(memdev_switch="any"))  # the adapter sits on a root port
    assert result.status is Status.FAIL
    assert "no memdev on this host sits behind a CXL switch" in result.reason


def test_without_a_selection_the_check_is_unchanged():
    result = _check(beluga_like(), expectations())
    assert result.status is Status.OK and "chosen" not in result.details


def test_recorded_ram_lab_tree_with_the_switch_manifest():
    report = run_doctor(Host.from_tree(FRESH), rack=load_rack_context(SWITCHED))  # the tree's hostname: lab-3
    assert report.host_entry == "lab-3"
    (outcome,) = [o for o in report.outcomes if o.id == "cxl.memdevs-present"]
    assert outcome.status is Status.OK, outcome.result.reason
    assert outcome.result.details["chosen"] == ["mem1", "mem0"]


def test_cli_doctor_fails_the_check_for_a_switch_the_host_does_not_have(tmp_path, capsys):
    text = SWITCHED.read_text().replace("      switch: any\n", '      switch: "0000:0c:00.0"\n')
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(text)
    code = run(["doctor", "--json", "--root", str(FRESH), "-f", str(wrong), "--host", "lab-3"])
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    (check,) = [c for c in json.loads(captured.out)["checks"] if c["id"] == "cxl.memdevs-present"]
    assert check["status"] == "fail"
    assert "no memdev on this host is behind switch 0000:0c:00.0" in check["reason"]
    assert "mem1 (0x10, behind switch 0000:0d:00.0, 256 MiB ram)" in check["reason"]
