"""Choosing a region's memdevs by switch and count: synthetic snapshots, and the trees recorded in the ram lab.

ram-fresh: mem0 is serial 0x11 at 0000:10:00.0, mem1 serial 0x10 at 0000:0f:00.0, both behind the
switch whose upstream port is 0000:0d:00.0 (tests/fixtures/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.errors import ExitCode
from belugactl.host.host import Host
from belugactl.host.snapshot import CxlMemdev, CxlState
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from belugactl.model.setup_plan import RunCommand
from belugactl.units import GiB
from belugactl.workflows.memdev_choice import MemdevSelectionError, MemdevWant, choose_memdevs, placed_facts
from belugactl.workflows.setup.applier import run_setup
from belugactl.workflows.setup.target import target_from_manifest

REPO = Path(__file__).resolve().parents[2]
FRESH = REPO / "tests" / "fixtures" / "ram-fresh"
DRIVERLESS = REPO / "tests" / "fixtures" / "ram-driverless"
SWITCHED = REPO / "tests" / "manifests" / "lab-ram-switch.yaml"
SWITCH_LINES = "      switch: any\n      count: 2\n"

SW_A = "0000:0d:00.0"
SW_B = "0000:8d:00.0"


def mem(name: str, serial: int | None, switch: str | None, *, ram: int = GiB, pmem: int = 0, state: str = "enabled",
        root_port: str | None = "0000:0c:00.0") -> CxlMemdev:
    return CxlMemdev(name, serial=serial, ram_size=ram, pmem_size=pmem, state=state, switch=switch,
                     root_port=root_port)


TWO_SWITCHES = [
    mem("mem0", 0x21, SW_B), mem("mem1", 0x12, SW_A), mem("mem2", 0x11, SW_A), mem("mem3", 0x20, SW_B),
]


def names(memdevs: list[CxlMemdev]) -> list[str]:
    return [m.name for m in memdevs]


# --- synthetic snapshots -----------------------------------------------------------------------


def test_switch_alone_takes_every_memdev_behind_it_by_serial():
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(switch=SW_A), "ram")) == ["mem2", "mem1"]
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(switch=SW_B), "ram")) == ["mem3", "mem0"]


def test_count_takes_the_first_n_by_serial():
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(count=3), "ram")) == ["mem2", "mem1", "mem3"]
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(switch=SW_B, count=1), "ram")) == ["mem3"]


def test_count_skips_memdevs_without_capacity_of_the_type_and_disabled_ones():
    memdevs = [mem("mem0", 1, None, ram=0, pmem=GiB), mem("mem1", 2, None, state="disabled"), mem("mem2", 3, None),
               mem("mem3", 4, None)]
    assert names(choose_memdevs(memdevs, MemdevWant(count=2), "ram")) == ["mem2", "mem3"]
    assert names(choose_memdevs(memdevs, MemdevWant(count=1), "pmem")) == ["mem0"]


def test_switch_any_with_one_switch():
    memdevs = [mem("mem0", 0x11, SW_A), mem("mem1", 0x10, SW_A)]
    assert names(choose_memdevs(memdevs, MemdevWant(switch="any"), "ram")) == ["mem1", "mem0"]


def test_switch_any_with_several_switches_names_them():
    with pytest.raises(MemdevSelectionError) as info:
        choose_memdevs(TWO_SWITCHES, MemdevWant(switch="any", count=2), "ram")
    err = info.value
    assert err.exit_code == ExitCode.USAGE
    assert "switch is any" in err.what and f"2 switches ({SW_A}, {SW_B})" in err.what
    assert f"mem2 (0x11, behind switch {SW_A}, 1 GiB ram)" in (err.why or "")
    assert f'switch: "{SW_A}"' in (err.fix or "")


def test_switch_any_with_no_switch():
    direct = [mem("mem0", 1, None), mem("mem1", 2, None)]
    with pytest.raises(MemdevSelectionError) as info:
        choose_memdevs(direct, MemdevWant(switch="any"), "ram")
    err = info.value
    assert "no memdev on this host sits behind a CXL switch" in err.what
    assert "mem0 (0x1, on root port 0000:0c:00.0, no switch, 1 GiB ram)" in (err.why or "")
    assert "drop switch" in (err.fix or "")


def test_a_switch_this_host_does_not_have():
    with pytest.raises(MemdevSelectionError) as info:
        choose_memdevs(TWO_SWITCHES, MemdevWant(switch="0000:55:00.0"), "ram")
    err = info.value
    assert err.what == "pool.source.memdevs.switch: no memdev on this host is behind switch 0000:55:00.0"
    assert f"the switches this host sees: {SW_A}, {SW_B}" in (err.fix or "")


def test_a_switch_whose_memdevs_lack_capacity_of_the_type():
    pmem_only = [mem("mem0", 1, SW_A, ram=0, pmem=GiB)]
    with pytest.raises(MemdevSelectionError) as info:
        choose_memdevs(pmem_only, MemdevWant(switch=SW_A), "ram")
    assert f"no memdev behind switch {SW_A} has ram capacity and is enabled" in info.value.what
    assert "0 B ram" in (info.value.why or "")


def test_count_more_than_present():
    with pytest.raises(MemdevSelectionError) as info:
        choose_memdevs(TWO_SWITCHES, MemdevWant(switch=SW_A, count=4), "ram")
    err = info.value
    assert err.what == (f"pool.source.memdevs.count is 4, but this host has 2 enabled memdev(s) with ram capacity "
                        f"behind switch {SW_A}")
    assert "lower pool.source.memdevs.count and pool.interleave.ways together" in (err.fix or "")
    # every memdev found is listed, in serial order, with its switch
    assert err.why == (
        f"memdevs found: mem2 (0x11, behind switch {SW_A}, 1 GiB ram); mem1 (0x12, behind switch {SW_A}, 1 GiB ram); "
        f"mem3 (0x20, behind switch {SW_B}, 1 GiB ram); mem0 (0x21, behind switch {SW_B}, 1 GiB ram)"
    )
    with pytest.raises(MemdevSelectionError, match="count is 5, but this host has 4 enabled memdev"):
        choose_memdevs(TWO_SWITCHES, MemdevWant(count=5), "ram")


def test_a_switch_cannot_be_chosen_from_cxl_list_facts_alone():
    listed_only = [mem("mem0", 1, None, root_port=None)]  # no sysfs: neither root port nor switch known
    with pytest.raises(MemdevSelectionError, match="do not say which switch"):
        choose_memdevs(listed_only, MemdevWant(switch="any"), "ram", placed=False)
    # count needs no switch
    assert names(choose_memdevs(listed_only, MemdevWant(count=1), "ram", placed=False)) == ["mem0"]
    assert placed_facts(CxlState(source="cxl list")) is False
    assert placed_facts(CxlState(source="cxl list+sysfs")) and placed_facts(CxlState(source="sysfs"))


def test_a_memdev_on_the_root_complex_has_no_switch():
    # A CXL 1.1 device (RCiEP) has no root port above it: with sysfs read, that means no switch either.
    rcd = [mem("mem0", 1, None, root_port=None)]
    with pytest.raises(MemdevSelectionError, match="no memdev on this host sits behind a CXL switch"):
        choose_memdevs(rcd, MemdevWant(switch="any"), "ram")


def test_count_below_present_needs_serials():
    unnamed = [mem("mem0", None, None), mem("mem1", None, None)]
    with pytest.raises(MemdevSelectionError, match="not every memdev reports a serial"):
        choose_memdevs(unnamed, MemdevWant(count=1), "ram")
    assert names(choose_memdevs(unnamed, MemdevWant(count=2), "ram")) == ["mem0", "mem1"]


def test_all_and_serials_keep_their_behaviour():
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(), "ram")) == ["mem2", "mem1", "mem3", "mem0"]
    assert choose_memdevs([mem("mem0", 1, None, ram=0)], MemdevWant(), "ram") == []  # setup says so itself
    assert names(choose_memdevs(TWO_SWITCHES, MemdevWant(serials=("0x20", "17")), "ram")) == ["mem3", "mem2"]
    with pytest.raises(MemdevSelectionError, match=r"serial\(s\) 0x99 named in pool.source.memdevs"):
        choose_memdevs(TWO_SWITCHES, MemdevWant(serials=("0x99",)), "ram")



# --- the recorded ram-lab trees through setup's planner -----------------------------------------


def _variant(tmp_path: Path, lines: str, ways: int = 2) -> Path:
    text = SWITCHED.read_text()
    assert SWITCH_LINES in text
    text = text.replace(SWITCH_LINES, lines).replace("    ways: 2\n", f"    ways: {ways}\n")
    path = tmp_path / "variant.yaml"
    path.write_text(text)
    return path


def _plan(root: Path, manifest: Path = SWITCHED, host: str = "lab-3"):
    loaded = load_manifest(str(manifest))
    target = target_from_manifest(loaded, host, layout=resolve_layout(loaded))
    return run_setup(Host.from_tree(root), target, dry_run=True).initial


def _create_argv(plan) -> str:
    (create,) = [s for s in plan.steps if s.id == "region.create"]
    return " ".join(next(a for a in create.actions if isinstance(a, RunCommand)).argv)


def test_switch_any_count_2_orders_the_recorded_memdevs_by_serial():
    target = target_from_manifest(load_manifest(str(SWITCHED)), "lab-3")
    assert (target.pool.memdev_switch, target.pool.memdev_count, target.pool.memdev_serials) == ("any", 2, None)
    # mem0 is serial 0x11 in this boot: position 0 is mem1 (0x10)
    assert _create_argv(_plan(FRESH)) == "cxl create-region -m -d decoder0.0 -w 2 -t ram -g 4096 mem1 mem0"


def test_the_named_switch_and_its_short_form(tmp_path):
    for written in ('      switch: "0000:0d:00.0"\n', "      switch: 0d:00.0\n"):
        plan = _plan(FRESH, _variant(tmp_path, written))
        assert _create_argv(plan).endswith(" -w 2 -t ram -g 4096 mem1 mem0")


def test_count_alone_on_the_recorded_tree(tmp_path):
    plan = _plan(FRESH, _variant(tmp_path, "      count: 2\n"))
    assert _create_argv(plan).endswith(" -w 2 -t ram -g 4096 mem1 mem0")


def test_an_existing_region_on_the_chosen_memdevs_is_found():
    # ram-driverless holds the region on 0x10, 0x11: nothing to create
    assert "region.create" not in [s.id for s in _plan(DRIVERLESS, host="lab-1").steps]


def test_plan_exits_2_with_what_why_and_fix(tmp_path, capsys):
    wrong = _variant(tmp_path, '      switch: "0000:0c:00.0"\n      count: 2\n')
    assert run(["plan", "-f", str(wrong), "--host", "lab-3", "--root", str(FRESH)]) == 2
    err = capsys.readouterr().err
    assert "no memdev on this host is behind switch 0000:0c:00.0" in err
    assert "mem1 (0x10, behind switch 0000:0d:00.0, 256 MiB ram); mem0 (0x11, behind switch 0000:0d:00.0" in err
    assert "the switches this host sees: 0000:0d:00.0" in err
    assert "Traceback" not in err


def test_plan_with_more_count_than_memdevs_exits_2(tmp_path, capsys):
    too_many = _variant(tmp_path, "      switch: any\n      count: 3\n", ways=3)
    assert run(["plan", "-f", str(too_many), "--host", "lab-3", "--root", str(FRESH)]) == 2
    err = capsys.readouterr().err
    assert ("pool.source.memdevs.count is 3, but this host has 2 enabled memdev(s) with ram capacity behind its "
            "one switch 0000:0d:00.0") in err
