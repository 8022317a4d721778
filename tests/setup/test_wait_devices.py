"""`setup --wait-devices`: the boot unit waits, bounded, for the manifest's memory devices (issue 33 item 5).

The reads replay recorded hosts in sequence: first `nocxl` (no device yet), then `ram-fresh` (recorded
in the ram lab: serials 0x10 and 0x11). The clock and the pause are fakes, so nothing sleeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.host.host import Host
from belugactl.workflows.setup.systemd import BOOT_WAIT_DEVICES_S, unit_text
from belugactl.workflows.setup.target import PoolTarget
from belugactl.workflows.setup.wait_devices import DeviceWant, memdevs_on, wait_for_devices, want_for

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
RAM_RACK = REPO / "examples" / "lab-ram-rack.yaml"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def reads(*trees: str):
    """A reader giving each tree's memdevs in turn, the last one from then on."""
    hosts = [Host.from_tree(FIXTURES / t) for t in trees]
    calls = {"n": 0}

    def read():
        host = hosts[min(calls["n"], len(hosts) - 1)]
        calls["n"] += 1
        return memdevs_on(host)

    return read


def test_the_device_that_appears_on_the_second_read_ends_the_wait():
    clock = FakeClock()
    result = wait_for_devices(
        reads("nocxl", "ram-fresh"), DeviceWant(serials=("0x10", "16", "0x11")), 30, clock=clock, pause=clock.pause
    )
    assert result.complete and result.reads == 2
    assert clock.pauses == [1.0]  # one poll interval, no real sleeping
    assert sorted(result.found) == ["mem0", "mem1"]


def test_a_device_that_never_comes_is_named_when_the_time_is_up():
    clock = FakeClock()
    result = wait_for_devices(
        reads("nocxl", "ram-fresh"), DeviceWant(serials=("0x10", "0x12")), 5, clock=clock, pause=clock.pause
    )
    assert not result.complete and result.missing == ("0x12",)
    assert result.reads == 6 and clock.now == 5  # bounded: reads at 0..5 s, the last pause cut to what is left


def test_a_count_waits_for_that_many_memdevs():
    clock = FakeClock()
    result = wait_for_devices(reads("nocxl"), DeviceWant(count=2), 2, clock=clock, pause=clock.pause)
    assert result.missing == ("2 more memdev(s)",)
    assert wait_for_devices(reads("ram-fresh"), DeviceWant(count=2), 0).complete


def test_what_the_manifest_makes_setup_wait_for():
    assert want_for(PoolTarget("cxl-region", 1, memdev_serials=("0x10", "0x11"))) == DeviceWant(("0x10", "0x11"))
    assert want_for(PoolTarget("cxl-region", 1, memdev_count=2, ways=1)) == DeviceWant(count=2)
    assert want_for(PoolTarget("cxl-region", 1, ways=4)) == DeviceWant(count=4)
    assert want_for(PoolTarget("dax-device", 1, dax_device="dax0.0")) is None


def _manifest_with_serials(tmp_path: Path, serials: str) -> Path:
    text = RAM_RACK.read_text()
    start = text.index("    memdevs:")
    end = text.index("count: 2", start) + len("count: 2")
    path = tmp_path / "rack.yaml"
    path.write_text(text[:start] + f"    memdevs: [{serials}]" + text[end:])
    return path


def test_setup_names_the_missing_device_and_exits_3(tmp_path, capsys):
    manifest = _manifest_with_serials(tmp_path, '"0x10", "0x12"')
    argv = [
        "setup",
        "-f",
        str(manifest),
        "--host",
        "lab-3",
        "--root",
        str(FIXTURES / "ram-fresh"),
        "--dry-run",
        "--wait-devices",
        "0",
    ]
    assert run(argv) == 3
    err = capsys.readouterr().err
    assert "still missing after 0 s: 0x12" in err and "Traceback" not in err


def test_setup_goes_on_once_the_devices_are_there(tmp_path, capsys):
    manifest = _manifest_with_serials(tmp_path, '"0x10", "0x11"')
    argv = [
        "setup",
        "-f",
        str(manifest),
        "--host",
        "lab-3",
        "--root",
        str(FIXTURES / "ram-fresh"),
        "--dry-run",
        "--wait-devices",
        "0",
    ]
    assert run(argv) == 0
    captured = capsys.readouterr()
    assert "wait-devices: memdev serial(s) 0x10, 0x11 present" in captured.err
    assert "region.create" in captured.out  # the plan ran after the wait


@pytest.mark.parametrize("value", ["-1", "601"])
def test_an_unbounded_wait_is_refused_with_exit_2(value, capsys):
    assert run(["setup", "-f", str(RAM_RACK), "--host", "lab-3", "--wait-devices", value, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--wait-devices" in err and "0..600" in err and "Traceback" not in err


def test_the_boot_unit_waits_for_the_devices():
    text = unit_text("/etc/belugactl/rack.yaml", "h1", ["/usr/bin/belugactl"])
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(f"--yes --wait-devices {BOOT_WAIT_DEVICES_S}")


def test_a_poll_reads_sysfs_or_one_listing_never_the_poison_lists():
    fresh = Host.from_tree(FIXTURES / "ram-fresh")  # /sys/bus/cxl: serials from sysfs, no tool run
    assert sorted(m.serial for m in memdevs_on(fresh)) == [0x10, 0x11]
    assert fresh.runner.calls == []  # type: ignore[attr-defined]
    bare = Host.from_tree(FIXTURES / "nocxl")  # no bus: the one memdev listing
    assert memdevs_on(bare) == []
    assert bare.runner.calls == [("cxl", "list", "-M", "-i")]  # type: ignore[attr-defined]
