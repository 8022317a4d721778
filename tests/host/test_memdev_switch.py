"""Which CXL switch a memdev sits behind: read from its PCI path in sysfs, kept through the merge with `cxl list`."""

from __future__ import annotations

import json

import pytest

from belugactl.host.read_cxl import CXL_LIST_COMMANDS, parse_cxl_list
from belugactl.host.read_pci import switch_upstream_port_of
from belugactl.host.read_tools import run_json
from tests.support.fixture_trees import host, snapshot

SWITCHED = "/sys/devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/0000:0e:01.0/0000:10:00.0/mem0"


@pytest.mark.parametrize(
    ("path", "switch"),
    [
        (SWITCHED, "0000:0d:00.0"),  # root port / upstream port / downstream port / device
        ("/sys/devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/mem0", None),  # directly on the root port
        ("/sys/devices/pci0000:0c/0000:0c:00.0/mem0", None),  # on the root complex
        # two switches in a row: the nearest one's upstream port
        ("/sys/devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/0000:0e:00.0/0000:0f:00.0/0000:10:02.0/"
         "0000:11:00.0/mem3", "0000:0f:00.0"),
        ("/sys/devices/pci0000:0C/0000:0C:00.0/0000:0D:00.0/0000:0E:01.0/0000:10:00.0/mem0", "0000:0d:00.0"),
        (None, None),
        ("/sys/devices/platform/cxl_mem.0/mem0", None),  # no PCI path (cxl_test)
    ],
)
def test_switch_upstream_port_from_the_pci_path(path, switch):
    assert switch_upstream_port_of(path) == switch


def test_recorded_ram_lab_trees_have_both_memdevs_behind_the_switch():
    for tree in ("ram-fresh", "ram-driverless"):
        memdevs = snapshot(tree).cxl.memdevs
        assert {(m.host_bdf, m.switch) for m in memdevs} == {
            ("0000:10:00.0", "0000:0d:00.0"),
            ("0000:0f:00.0", "0000:0d:00.0"),
        }, tree
    fresh = {m.name: m.serial for m in snapshot("ram-fresh").cxl.memdevs}
    assert fresh == {"mem0": 0x11, "mem1": 0x10}


@pytest.mark.parametrize("tree", ["lab-guest", "beluga-intel", "amd-host"])
def test_memdevs_on_root_ports_have_no_switch(tree):
    memdevs = snapshot(tree).cxl.memdevs
    assert memdevs and all(m.switch is None and m.root_port for m in memdevs)


def test_cxl_list_cannot_tell_and_the_merge_keeps_the_sysfs_value():
    h = host("ram-fresh")
    listed = parse_cxl_list(run_json(h, CXL_LIST_COMMANDS[0], []) or [])
    assert {m.name for m in listed.memdevs} == {"mem0", "mem1"}
    assert all(m.switch is None for m in listed.memdevs)  # the tool's JSON has no such fact
    cxl = snapshot("ram-fresh").cxl
    assert cxl.source == "cxl list+sysfs"
    assert all(m.switch == "0000:0d:00.0" for m in cxl.memdevs)


def test_discover_json_carries_the_switch(capsys):
    from belugactl.cli.app import run
    from tests.support.fixture_trees import tree

    assert run(["discover", "--root", str(tree("ram-fresh")), "--json"]) == 0
    memdevs = json.loads(capsys.readouterr().out)["cxl"]["memdevs"]
    assert {m["name"]: m["switch"] for m in memdevs} == {"mem0": "0000:0d:00.0", "mem1": "0000:0d:00.0"}
    assert run(["discover", "--root", str(tree("ram-fresh"))]) == 0
    assert "behind switch 0000:0d:00.0" in capsys.readouterr().out
