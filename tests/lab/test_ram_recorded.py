"""A host tree recorded in the ram lab (`discover --capture`) with the auto-online trap sprung.

Recorded in a ram-profile guest (QEMU 10, kernel 6.12, cxl 81, 2 volatile devices behind a switch)
after `modprobe kmem` with the kernel's default policy (auto_online_blocks=online), then
`cxl create-region -t ram -w 2 -g 4096` with targets ordered by serial: the region's dax device was
onlined at once as System RAM in ZONE_NORMAL (MemTotal grew by 512 MiB, movable false). In that boot
the memdev names came up against serial order (mem0 = 0x11), which the tree keeps.
Recovery verified in the same guest: `echo offline > .../auto_online_blocks`, then
`daxctl reconfigure-device --mode=devdax --force dax0.0` (MemTotal back down, /dev/dax0.0 present).
"""

import json
import os
from pathlib import Path

import pytest

from tests.support.lab import run_cli

pytestmark = pytest.mark.process  # every test here starts a process

TREE = Path(__file__).parent / "fixtures" / "ram-autoonline"


def _cli_json(*args: str) -> tuple[int, dict]:
    r = run_cli(dict(os.environ), *args, "--root", str(TREE), "--json", timeout=120)
    return r.returncode, json.loads(r.stdout)


def test_the_recorded_ram_region_is_two_way_with_positions_by_serial_not_by_name():
    rc, doc = _cli_json("discover")
    assert rc == 0
    serials = {m["name"]: m["serial"] for m in doc["cxl"]["memdevs"]}
    assert serials == {"mem0": 0x11, "mem1": 0x10}  # probe order against serial order
    (region,) = doc["cxl"]["regions"]
    assert (region["type"], region["interleave_ways"], region["interleave_granularity"]) == ("ram", 2, 4096)
    assert [serials[m] for m in region["memdevs"]] == [0x10, 0x11]  # position 0 is the smallest serial
    (dax,) = doc["dax"]
    assert (dax["mode"], dax["driver"], dax["movable"]) == ("system-ram", "kmem", False)
    assert doc["memory"]["auto_online_blocks"] == "online"


def test_doctor_names_the_auto_online_trap_and_how_to_recover():
    rc, doc = _cli_json("doctor")
    assert rc != 0 and doc["failed"]
    checks = {c["id"]: c for c in doc["checks"]}
    failed = sorted(k for k, c in checks.items() if c["status"] == "fail")
    assert failed == ["dax.mode-devdax", "memory.auto-online"]
    text = json.dumps(checks["dax.mode-devdax"])
    assert "system-ram" in text and "daxctl reconfigure-device --mode=devdax" in text
    assert "memhp_default_state=offline" in text
    assert "ZONE_NORMAL (not movable)" in text and "auto_online_blocks" in checks["dax.mode-devdax"]["fix"]
    assert "memhp_default_state=offline" in json.dumps(checks["memory.auto-online"])
    assert checks["tools.ndctl-version"]["status"] == "ok"  # cxl 81 from the guest's tools
