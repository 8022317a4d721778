"""Setup with a memory-type split (issue 33 item 1): exactly the KV area's MTRR pieces, per host,
idempotent, shown by the dry run; a host with too few free variable MTRRs is refused unchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest

from belugactl.errors import InputError
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.applier import run_setup, run_teardown
from belugactl.workflows.setup.target import SetupTarget, target_from_manifest
from belugactl.workflows.setup.topics.mtrr import span_pieces, uncachable_spans
from tests.support.fake_machine import LAB, FakeMachine

# The lab manifest with a split: a 128 MiB KV area (one piece at pool offset 256 MiB) after two 64 MiB
# partitions; header, rings and journal below them.
SPLIT = {
    "pool_memory_type: write-back": "memory_types: seeds\n  kv_mtrrs: 8",
    "shared_kv: 254MiB": "shared_kv: 128MiB",
    "partition_size: equal ": "partition_size: 64MiB",
}


@dataclasses.dataclass(frozen=True)
class SplitTarget(SetupTarget):
    """SetupTarget with the field target.py is to carry (see mtrr.uncachable_spans)."""

    uncachable_spans: tuple[tuple[int, int], ...] | None = None


def split_target(edit: dict[str, str] = SPLIT, host: str = "lab-1") -> SetupTarget:
    """The target setup builds (target_from_manifest with the layout): the split is read from its header."""
    text = LAB.read_text()
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    manifest = load_manifest_text(text, file="lab.yaml")
    return target_from_manifest(manifest, host, layout=resolve_layout(manifest))


def test_the_split_is_read_from_the_target_and_an_explicit_field_wins():
    target = split_target()
    assert uncachable_spans(target) == ((256 << 20, 128 << 20),)
    assert uncachable_spans(split_target({"pool_memory_type: write-back": "pool_memory_type: uncachable"})) is None
    assert uncachable_spans(split_target({})) is None
    fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(target)}
    explicit = SplitTarget(**{**fields, "uncachable_spans": ((512 << 20, 2 << 20),)})
    assert uncachable_spans(explicit) == ((512 << 20, 2 << 20),)


def _aligned_dax(machine: FakeMachine, base: int) -> None:
    """Put the pool's dax device at `base` (the fake's devdax namespace starts 2 MiB into the region)."""
    (machine.root / "sys/bus/dax/devices/dax0.0/resource").write_text(f"{base:#x}\n")


def _prepared(machine: FakeMachine, base: int | None) -> SetupTarget:
    target = split_target()
    assert target.uncachable is False and uncachable_spans(target) == ((256 << 20, 128 << 20),)
    run_setup(machine.host, target, only=["region", "devdax"])
    if base is not None:
        _aligned_dax(machine, base)
    return target


def test_a_split_adds_exactly_the_kv_pieces_idempotently_and_teardown_removes_them(lab1):
    target = _prepared(lab1, 0x290000000)  # the region's start: aligned to 256 MiB
    plan = run_setup(lab1.host, target, only=["mtrr"], dry_run=True).initial
    step = next(s for s in plan.steps if s.id == "mtrr.add")
    # pool offset 256 MiB at 0x290000000: one 128 MiB MTRR at 0x2A0000000, nothing over the header or rings
    assert [(a.base, a.size) for a in step.actions] == [(0x2A0000000, 128 << 20)]
    assert "KV area" in step.note and "0x10000000" in step.note and "write-back" in step.note
    assert 'echo "base=0x2a0000000 size=0x8000000 type=uncachable" > /proc/mtrr' in [
        a.display() for a in step.actions
    ]
    assert set(lab1.mtrr) == {0}  # the dry run wrote nothing
    run_setup(lab1.host, target, only=["mtrr"])
    assert sorted(v[:3] for v in lab1.mtrr.values()) == [
        (0xC0000000, 1 << 30, "uncachable"), (0x2A0000000, 128 << 20, "uncachable")
    ]
    assert run_setup(lab1.host, target, only=["mtrr"]).applied == []
    run_teardown(lab1.host, target, force=True)
    assert set(lab1.mtrr) == {0}


def test_each_host_counts_its_own_pieces(lab1):
    target = _prepared(lab1, None)  # the fake's devdax starts at 0x290200000: aligned to 2 MiB only
    base = 0x290200000
    pieces = span_pieces(base, 256 << 20, 128 << 20)
    assert len(pieces) > 1
    step = next(s for s in run_setup(lab1.host, target, only=["mtrr"], dry_run=True).initial.steps
                if s.id == "mtrr.add")
    assert [(a.base, a.size) for a in step.actions] == pieces


def test_too_few_free_mtrrs_for_the_kv_area_is_refused_with_the_counts_and_changes_nothing(tmp_path, pool_file):
    machine = FakeMachine(tmp_path / "h", pool_file, variable_mtrrs=4)
    target = _prepared(machine, None)
    needed = len(span_pieces(0x290200000, 256 << 20, 128 << 20))
    before = sorted((p, p.read_bytes()) for p in machine.root.rglob("*") if p.is_file() and "run/" not in str(p))
    with pytest.raises(InputError) as err:
        run_setup(machine.host, target, only=["mtrr"])
    assert err.value.exit_code == 2
    assert f"needs {needed} MTRR(s) on this host; 3 of 4 are free" in err.value.what
    assert "kv_mtrrs" in err.value.fix
    after = sorted((p, p.read_bytes()) for p in machine.root.rglob("*") if p.is_file() and "run/" not in str(p))
    assert after == before and set(machine.mtrr) == {0}


def test_a_whole_pool_range_setup_added_before_is_replaced_by_the_kv_pieces(lab1):
    whole = split_target({"pool_memory_type: write-back": "pool_memory_type: uncachable"})
    run_setup(lab1.host, whole)
    _aligned_dax(lab1, 0x290000000)
    assert (0x290000000, 256 << 20, "uncachable") in [v[:3] for v in lab1.mtrr.values()]
    target = split_target()
    plan = run_setup(lab1.host, target, only=["mtrr"], dry_run=True).initial
    assert [s.id for s in plan.steps] == ["mtrr.remove", "mtrr.add"]
    run_setup(lab1.host, target, only=["mtrr"])
    assert sorted(v[:3] for v in lab1.mtrr.values()) == [
        (0xC0000000, 1 << 30, "uncachable"), (0x2A0000000, 128 << 20, "uncachable")
    ]
    state = json.loads(lab1.read("var/lib/belugactl/state.json"))
    assert [(m["base"], m["size"]) for m in state["mtrr"]] == [(0x2A0000000, 128 << 20)]
