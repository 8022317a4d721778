"""The ram selftest's pure parts: probe offsets, geometry from `cxl list`/`daxctl list`, comparison, report."""

import pytest

from belugactl.errors import StepFailed
from belugactl.lab import ramregion
from belugactl.lab.selftest import Check
from belugactl.lab.selftest_ram import (
    MAX_SPAN,
    PATTERN_BYTES,
    TAIL_WINDOW,
    GuestRegion,
    RamSelftestReport,
    Target,
    choose_offsets,
    file_index_by_position,
    geometry_check,
    parse_region,
    plan_probes,
    render_lines,
    serial_order_check,
    spans,
)

MiB = 1024 * 1024
SIZE = 512 * MiB

# As cxl/daxctl 81 print them in the ram lab (raw mode: serials as integers), one guest where
# probe order made mem1 the device with serial 0x10.
REGIONS = [{
    "region": "region0", "resource": 0x290000000, "size": SIZE, "type": "ram", "interleave_ways": 2,
    "interleave_granularity": 4096, "decode_state": "commit",
    "mappings": [
        {"position": 1, "memdev": "mem0", "decoder": "decoder6.0"},
        {"position": 0, "memdev": "mem1", "decoder": "decoder5.0"},
    ],
}]  # fmt: skip
MEMDEVS = [{"memdev": "mem0", "ram_size": 256 * MiB, "serial": 17}, {"memdev": "mem1", "ram_size": 256 * MiB,
                                                                      "serial": 16}]  # fmt: skip
DAXES = [{"chardev": "dax0.0", "size": SIZE, "target_node": 0, "align": 2 * MiB, "mode": "devdax"}]


def _region(guest="lab-1", serials=(0x10, 0x11), size=SIZE, created=True) -> GuestRegion:
    targets = [Target(p, f"mem{p}", s) for p, s in enumerate(serials)]
    return GuestRegion(guest, "region0", size, len(serials), 4096, targets, "dax0.0", size, "devdax", created)


def test_parse_region_orders_targets_by_position_and_names_serials():
    r = parse_region("lab-2", REGIONS, MEMDEVS, DAXES, created=False)
    assert (r.region, r.size, r.ways, r.granularity, r.dax, r.dax_size) == ("region0", SIZE, 2, 4096, "dax0.0", SIZE)
    assert r.targets == [Target(0, "mem1", 0x10), Target(1, "mem0", 0x11)]
    assert r.geometry() == (SIZE, 2, 4096, (0x10, 0x11))
    assert not r.created


def test_parse_region_accepts_single_objects_and_hex_serials():
    memdevs = [{"memdev": "mem0", "serial": "0x11"}, {"memdev": "mem1", "serial": "0x10"}]
    r = parse_region("lab-1", REGIONS[0], memdevs, DAXES[0], created=True)
    assert [t.serial for t in r.targets] == [0x10, 0x11]


@pytest.mark.parametrize(
    ("regions", "daxes", "words"),
    [
        ([], DAXES, "0 CXL regions"),
        (REGIONS * 2, DAXES, "2 CXL regions"),
        (REGIONS, [], "0 dax devices"),
        (REGIONS, [dict(DAXES[0], mode="system-ram")], "not devdax"),
    ],
)
def test_parse_region_refuses_what_it_cannot_use(regions, daxes, words):
    with pytest.raises(StepFailed, match=words) as err:
        parse_region("lab-1", regions, MEMDEVS, daxes, created=False)
    assert err.value.fix


def test_parse_region_refuses_a_target_without_a_serial():
    with pytest.raises(StepFailed, match="by serial"):
        parse_region("lab-1", REGIONS, MEMDEVS[:1], DAXES, created=False)


def test_geometry_check_passes_equal_and_names_a_disagreeing_position():
    assert geometry_check([_region("lab-1"), _region("lab-2")]).ok
    bad = geometry_check([_region("lab-1"), _region("lab-2", serials=(0x11, 0x10))])
    assert not bad.ok
    assert "lab-2: 512 MiB, 2-way, granularity 4096, positions [0:mem0=0x11, 1:mem1=0x10]" in bad.detail
    assert not geometry_check([_region("lab-1"), _region("lab-2", size=256 * MiB)]).ok
    assert not geometry_check([]).ok


def test_serial_order_check_wants_one_backing_file_per_position():
    files = ["/s/pool-0.raw", "/s/pool-1.raw"]
    assert serial_order_check([_region()], files).ok
    short = serial_order_check([_region(serials=(0x10,))], files)
    assert not short.ok and "1-way region, 2 backing files" in short.detail


def test_offsets_on_a_fresh_region_cover_every_position_of_two_stripes_and_the_last_chunk():
    offsets = choose_offsets(SIZE, 2, 4096, tail=False)
    assert offsets == [0x8, 0x1008, 0x2008, 0x3008, SIZE - 4096 + 8]
    positions = [ramregion.backing_position(o, 2, 4096)[0] for o in offsets[:4]]
    assert positions == [0, 1, 0, 1]


@pytest.mark.parametrize("ways", [1, 2, 3, 4])
def test_offsets_on_a_pre_existing_region_stay_in_the_last_2_mib(ways):
    size = ways * 256 * MiB
    offsets = choose_offsets(size, ways, 4096, tail=True)
    assert all(size - TAIL_WINDOW <= o and o + PATTERN_BYTES <= size for o in offsets), [hex(o) for o in offsets]
    near = offsets[: 2 * ways]
    assert sorted(ramregion.backing_position(o, ways, 4096)[0] for o in near) == sorted(list(range(ways)) * 2)
    assert len(set(offsets)) == len(offsets)


def test_offsets_refuse_a_region_too_small_to_probe():
    with pytest.raises(StepFailed, match="too small"):
        choose_offsets(8192, 2, 4096, tail=False)


def test_probes_go_to_the_file_of_the_serial_at_each_position():
    # Position 0 holds serial 0x11 here: its bytes are in file 1 (the second smallest serial).
    r = _region(serials=(0x11, 0x10))
    assert file_index_by_position(r.targets) == {0: 1, 1: 0}
    probes = plan_probes(r, [0x8, 0x1008, 0x2008])
    assert [(p.position, p.file_index, p.file_offset) for p in probes] == [(0, 1, 0x8), (1, 0, 0x8), (0, 1, 0x1008)]


def test_spans_merge_near_offsets_and_keep_far_ones_apart():
    assert spans([0x8, 0x1008, 0x2008, 0x3008, SIZE - 4088], 16) == [(0x8, 0x3008 + 16 - 0x8), (SIZE - 4088, 16)]
    split = spans([i * 4096 for i in range(20)], 16)
    assert all(size <= MAX_SPAN for _, size in split) and len(split) == 3


def test_render_lines_show_geometry_checks_and_what_was_left():
    report = RamSelftestReport("st", regions=[_region("lab-1"), _region("lab-2", created=False)], probes_at="start")
    report.checks = [Check("lab-1 writes position 1", True, "dax 0x1008 -> pool-1.raw@0x8: same bytes"),
                     Check("lab-2 writes position 0", False, "dax 0x8 -> pool-0.raw@0x8: wrote aa")]  # fmt: skip
    report.cleaned_up, report.seconds = True, 3.5
    lines = render_lines(report, keep=False)
    assert lines[0] == ("lab-1: region0 512 MiB, 2-way, granularity 4096, targets mem0 (0x10), mem1 (0x11) "
                        "-> /dev/dax0.0 (devdax, made by the selftest)")  # fmt: skip
    assert lines[1].endswith("(devdax, pre-existing, used as is)")
    assert "  [ok] lab-1 writes position 1: dax 0x1008 -> pool-1.raw@0x8: same bytes" in lines
    assert "  [FAIL] lab-2 writes position 0: dax 0x8 -> pool-0.raw@0x8: wrote aa" in lines
    assert lines[-1] == "regions made by the selftest: torn down; 0 guest commands in 3.5 s"
    assert render_lines(report, keep=True)[-1].startswith("regions made by the selftest: torn down")
    report.cleaned_up = False
    assert "kept (--keep)" in render_lines(report, keep=True)[-1]
    assert "cleanup FAILED" in render_lines(report, keep=False)[-1]
    report.regions = [_region(created=False)]
    assert "none made (pre-existing regions left as they are)" in render_lines(report, keep=False)[-1]


def test_report_json_keeps_the_pmem_shape_and_adds_the_regions():
    doc = RamSelftestReport("st", regions=[_region()]).to_dict()
    assert {"lab", "ok", "checks", "steps", "cleaned_up", "seconds", "error"} <= set(doc)
    assert doc["profile"] == "ram"
    assert doc["regions"][0]["targets"][1] == {"position": 1, "memdev": "mem1", "serial": 0x11}
