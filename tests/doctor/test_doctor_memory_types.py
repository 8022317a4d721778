"""Doctor with memory types by area (issue 33 item 1): mtrr.kv-uncachable (the KV area's pieces covered
as the manifest says) and mtrr.control-cached (a warning when the CPU polls uncachable memory)."""

from __future__ import annotations

from dataclasses import replace

from belugactl.host.snapshot import MtrrEntry
from belugactl.model.layout import mtrr_pieces, resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.units import GiB, MiB
from belugactl.workflows.doctor import Status, builtin_registry
from tests.support.doctor_snapshots import REGION_BASE, beluga_like, ctx, expectations
from tests.support.fake_machine import LAB

REGISTRY = builtin_registry()
DAX_BASE = REGION_BASE + 2 * MiB  # beluga_like's devdax namespace starts after its info block


def _layout(edit: dict[str, str]):
    text = LAB.read_text()
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    return resolve_layout(load_manifest_text(text))


SPLIT = _layout({
    "pool_memory_type: write-back": "memory_types: seeds\n  kv_mtrrs: 8",
    "shared_kv: 254MiB": "shared_kv: 128MiB",
    "partition_size: equal ": "partition_size: 64MiB",
})
WHOLE_UC = _layout({"pool_memory_type: write-back": "pool_memory_type: uncachable"})
KV_BASE = DAX_BASE + SPLIT.shared_kv.offset
KV_PIECES = mtrr_pieces(KV_BASE, SPLIT.shared_kv.size)


def run(check_id, snapshot, expect=None):
    check = REGISTRY.get(check_id)
    assert check is not None, check_id
    return check.run(ctx(snapshot, expect))


def _with_mtrr(*entries: tuple[int, int]):
    firmware = MtrrEntry(0, 0xC0000000, GiB, "uncachable")
    added = [MtrrEntry(i + 1, b, s, "uncachable") for i, (b, s) in enumerate(entries)]
    return replace(beluga_like(), mtrr=[firmware, *added])


def test_the_kv_check_skips_without_a_manifest_or_a_split():
    assert run("mtrr.kv-uncachable", beluga_like()).status is Status.SKIP
    result = run("mtrr.kv-uncachable", beluga_like(), expectations(layout=WHOLE_UC, pool_memory="uncachable"))
    assert result.status is Status.SKIP and "one memory type" in result.reason
    # and the whole-pool check leaves a split to it
    result = run("mtrr.pool-uncachable", beluga_like(), expectations(layout=SPLIT))
    assert result.status is Status.SKIP and "mtrr.kv-uncachable" in result.reason


def test_the_kv_area_uncovered_fails_with_the_pieces_to_add():
    assert SPLIT.split and len(KV_PIECES) > 1  # 2 MiB-aligned base: the host needs more than the layout's one
    result = run("mtrr.kv-uncachable", _with_mtrr(), expectations(layout=SPLIT))
    assert result.status is Status.FAIL
    assert f"pool offset {SPLIT.shared_kv.offset:#x}" in result.reason and f"{len(KV_PIECES)} MTRR(s)" in result.reason
    for base, size in KV_PIECES:
        assert f'echo "base=0x{base:x} size=0x{size:x} type=uncachable" > /proc/mtrr' in result.fix
    assert "--only mtrr" in result.fix
    half = _with_mtrr(*KV_PIECES[:-1])
    assert run("mtrr.kv-uncachable", half, expectations(layout=SPLIT)).status is Status.FAIL
    absent = replace(beluga_like(), mtrr=None)
    assert "/proc/mtrr is absent" in run("mtrr.kv-uncachable", absent, expectations(layout=SPLIT)).reason


def test_the_kv_area_covered_is_ok():
    result = run("mtrr.kv-uncachable", _with_mtrr(*KV_PIECES), expectations(layout=SPLIT))
    assert result.status is Status.OK, result.reason
    assert result.details["gaps"] == []


def test_control_areas_outside_uncachable_ranges_are_ok():
    assert run("mtrr.control-cached", beluga_like()).status is Status.SKIP  # no manifest
    result = run("mtrr.control-cached", _with_mtrr(*KV_PIECES), expectations(layout=SPLIT))
    assert result.status is Status.OK, result.reason


def test_the_cpu_polling_uncachable_memory_is_a_warning_with_the_fix():
    whole_pool = _with_mtrr((REGION_BASE, 512 * MiB))  # what a whole-pool uncachable setup added
    for layout in (SPLIT, WHOLE_UC):
        result = run("mtrr.control-cached", whole_pool, expectations(layout=layout))
        assert result.status is Status.WARN, layout.split
        assert "polls uncachable memory" in result.reason and "reg01" in result.reason
        assert "memory_types: seeds" in result.fix and "belugactl setup" in result.fix
    assert REGISTRY.get("mtrr.control-cached").severity.value == "warning"
    # a range that covers only the journal's last page still counts
    journal_end = DAX_BASE + SPLIT.journal.end
    tail = _with_mtrr((journal_end - 4096, 4096))
    assert run("mtrr.control-cached", tail, expectations(layout=SPLIT)).status is Status.WARN
