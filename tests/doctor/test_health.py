"""Device health and poison lists: discovery reads them, doctor judges them (issue 33 item 4).

The lab-guest tree (lab-1 after setup) gets the hand-written `cxl list -M -H -i` / `cxl list -R -L -i`
outputs of tests/fixtures/cxl-health/ added to its recorded commands; its own recording predates
both listings, which is the "old capture" case: not reported, never "healthy".
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from belugactl.host.command_runner import CommandResult
from belugactl.host.host import Host
from belugactl.host.read_cxl_health import HEALTH_LIST, MEDIA_ERRORS_LIST, parse_health, parse_media_errors
from belugactl.host.snapshot import MediaError, MemdevHealth
from belugactl.units import MiB
from belugactl.workflows.discover import discover
from belugactl.workflows.doctor import Status, run_doctor
from belugactl.workflows.doctor.checks.health import judge_health
from belugactl.workflows.rack_context import load_rack_context

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "tests" / "fixtures" / "lab-guest"
RECORDED = REPO / "tests" / "fixtures" / "cxl-health"
LAB = REPO / "examples" / "lab.yaml"
REGION_BASE = 0x3D0000000  # lab-guest's region0; its dax0.0 starts 2 MiB in


def lab_host(health: str | None = None, media: str | None = None) -> Host:
    host = Host.from_tree(TREE)
    if health is not None:
        host.runner.add(CommandResult(HEALTH_LIST, 0, (RECORDED / health).read_text()))  # type: ignore[attr-defined]
    if media is not None:
        host.runner.add(CommandResult(MEDIA_ERRORS_LIST, 0, (RECORDED / media).read_text()))  # type: ignore[attr-defined]
    return host


def outcomes(host: Host, *, manifest: bool = True) -> dict:
    rack = load_rack_context(LAB) if manifest else None
    report = run_doctor(host, rack=rack)
    return {o.id: o for o in report.outcomes}


# --- discovery ---------------------------------------------------------------------------------


def test_discovery_reads_health_and_media_errors_from_the_listings():
    snap = discover(lab_host("health-dirty-shutdowns.json", "media-errors-in-region.json"))
    health = snap.cxl.memdev("mem0").health
    assert health is not None and health.dirty_shutdowns == 3 and health.temperature == 41
    assert health.media_normal is True and health.ext_life_used == "normal"
    errors = snap.cxl.region("region0").media_errors
    assert errors == [
        MediaError(0x1000, 64, "Injected"),
        MediaError(0x10000000, 64, "Injected"),
        MediaError(0x10001000, 128, "Internal"),
    ]
    # the object listings are unchanged by the extra invocations
    assert snap.cxl.region("region0").memdevs == ["mem0"] and snap.problems == []


def test_an_old_capture_without_the_listings_reports_nothing_not_healthy():
    snap = discover(Host.from_tree(TREE))
    assert snap.cxl.memdev("mem0").health is None
    assert snap.cxl.region("region0").media_errors is None
    by_id = outcomes(Host.from_tree(TREE))
    for check_id in ("cxl.memdev-health", "cxl.media-errors"):
        assert by_id[check_id].status is Status.SKIP
        assert "not known to be" in by_id[check_id].result.reason
        assert by_id[check_id].result.fix


def test_a_region_listed_with_L_and_no_records_is_clean():
    snap = discover(lab_host(media="media-errors-none.json"))
    assert snap.cxl.region("region0").media_errors == []


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "problem"),
    [
        (129, "", "  error: unknown switch `L'\n", False),  # ndctl < 80: no -L, not a discovery problem
        # not root: the tool still prints the region (without media_errors) and says so on stderr only
        (0, "media-errors-none.json", "tracefs_instance_create() failed\n", True),
    ],
)
def test_poison_lists_that_could_not_be_read_stay_unknown(rc, stdout, stderr, problem):
    host = Host.from_tree(TREE)
    out = (RECORDED / stdout).read_text() if stdout else ""
    host.runner.add(CommandResult(MEDIA_ERRORS_LIST, rc, out, stderr))  # type: ignore[attr-defined]
    snap = discover(host)
    assert snap.cxl.region("region0").media_errors is None
    assert any("tracefs" in p for p in snap.problems) is problem


def test_parsers_take_the_documented_shapes_and_drop_what_cannot_be_placed():
    doc = {  # ndctl Documentation/cxl/cxl-list.txt, the -H example
        "maintenance_needed": True,
        "ext_temperature": "critical",
        "life_used_percent": 15,
        "temperature": 25,
        "dirty_shutdowns": 10,
    }
    health = parse_health(doc)
    assert health == MemdevHealth(
        maintenance_needed=True, ext_temperature="critical", life_used_percent=15, temperature=25, dirty_shutdowns=10
    )
    assert parse_health(None) is None
    records = [{"offset": "0x1000", "length": 64, "source": "Injected"}, {"length": 64}, "junk"]
    assert parse_media_errors(records) == [MediaError(0x1000, 64, "Injected")]


# --- doctor: health ------------------------------------------------------------------------------


def test_a_healthy_device_is_ok_and_says_its_figures():
    result = outcomes(lab_host("health-ok.json"))["cxl.memdev-health"].result
    assert result.status is Status.OK
    assert "mem0 life used 3 %, 41 C" in result.reason


def test_life_used_past_the_threshold_warns_with_a_fix():
    result = outcomes(lab_host("health-life-used.json"))["cxl.memdev-health"].result
    assert result.status is Status.WARN
    assert "life used 93 %" in result.reason and "maintenance needed" in result.reason
    assert "replacement" in result.fix


def test_dirty_shutdowns_warn_and_the_fix_says_start_empty():
    result = outcomes(lab_host("health-dirty-shutdowns.json"))["cxl.memdev-health"].result
    assert result.status is Status.WARN
    assert "3 dirty shutdown(s)" in result.reason
    assert "start-empty" in result.fix and "replacement" not in result.fix  # a power loss is not wear


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"hw_replacement_needed": True}, "fail"),
        ({"ext_life_used": "critical"}, "fail"),
        ({"life_used_percent": 95}, "fail"),
        ({"life_used_percent": 80}, "warn"),
        ({"life_used_percent": 79}, "ok"),
        ({"ext_temperature": "critical"}, "fail"),
        ({"ext_temperature": "warning"}, "warn"),
        ({"media_data_loss_imminent": True}, "warn"),
    ],
)
def test_thresholds(change, status):
    base = parse_health(json.loads((RECORDED / "health-ok.json").read_text())[0]["health"])
    assert base is not None
    fails, warns = judge_health(replace(base, **change))
    got = "fail" if fails else "warn" if warns else "ok"
    assert got == status


# --- doctor: media errors --------------------------------------------------------------------------


def test_media_errors_inside_the_pool_fail_with_pool_relative_ranges():
    by_id = outcomes(lab_host("health-ok.json", "media-errors-in-region.json"))
    outcome = by_id["cxl.media-errors"]
    result = outcome.result
    assert result.status is Status.FAIL and outcome.guards_data
    # region offset 256 MiB -> pool offset 254 MiB: dax0.0 starts 2 MiB into region0; the layout of
    # examples/lab.yaml puts it in the shared KV area (0x800000 + 0xfe00000)
    assert result.details["poisoned_pool_ranges"] == [
        {"offset": 254 * MiB, "length": 64, "source": "Injected", "area": "shared-kv"},
        {"offset": 254 * MiB + 0x1000, "length": 128, "source": "Internal", "area": "shared-kv"},
    ]
    assert result.details["pool_device"] == "dax0.0"
    assert "must not be served" in result.fix
    # the record in the namespace's info block is named, but is not a pool range
    assert "outside the pool: region0 0x1000+64" in result.reason


def test_media_errors_only_outside_the_pool_warn():
    host = lab_host(media="media-errors-in-region.json")
    data = json.loads((RECORDED / "media-errors-in-region.json").read_text())
    data[0]["media_errors"] = data[0]["media_errors"][:1]  # only the info block's line
    host.runner.add(CommandResult(MEDIA_ERRORS_LIST, 0, json.dumps(data)))  # type: ignore[attr-defined]
    result = outcomes(host)["cxl.media-errors"].result
    assert result.status is Status.WARN and result.details["poisoned_pool_ranges"] == []


def test_media_errors_without_a_manifest_fail_in_region_offsets():
    result = outcomes(lab_host(media="media-errors-in-region.json"), manifest=False)["cxl.media-errors"].result
    assert result.status is Status.FAIL
    assert "region0 0x10000000+64" in result.reason and result.details["poisoned_pool_ranges"] == []


def test_a_clean_poison_list_is_ok():
    result = outcomes(lab_host(media="media-errors-none.json"))["cxl.media-errors"].result
    assert result.status is Status.OK and result.details["poisoned_pool_ranges"] == []


def test_doctor_json_carries_the_ranges_for_the_server():
    by_id = outcomes(lab_host(media="media-errors-in-region.json"))
    data = json.loads(json.dumps(by_id["cxl.media-errors"].to_dict()))
    assert data["guards_data"] is True
    assert data["details"]["poisoned_pool_ranges"][0] == {
        "offset": 254 * MiB,
        "length": 64,
        "source": "Injected",
        "area": "shared-kv",
    }
