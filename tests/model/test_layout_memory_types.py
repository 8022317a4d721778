"""The layout of a memory-type split (issue 33 item 1): the shared KV area placed and sized for a few
MTRR pieces of its own, the control areas and partitions outside them; no split, no change."""

import pytest

from belugactl.errors import ManifestError
from belugactl.model.layout import mtrr_pieces, resolve_layout, split_geometry
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.units import GiB, MiB
from tests.support.manifests import EXAMPLES, MINIMAL

# MINIMAL's layout hash as belugactl computed it before splits existed (commit 1c3dcb9): a pool set up
# then must still verify.
MINIMAL_HASH = "f03de9fba67337ec6a223bc22021e596d67df4dab581ed6326fa5eecf6bc6203"

RACK = """\
version: 1
name: r
pool:
  source: {kind: dax-device, device: /dev/dax0.0}
  size: 64GiB
layout:
  metadata: {journal: 64MiB}
  shared_kv: rest
hosts:
  - {name: a, address: 10.0.0.1, roles: [metadata, worker], platform: cpu}
  - {name: b, address: 10.0.0.2, platform: cpu}
"""


def _split(text: str = RACK, caching: str = "  memory_types: seeds\n"):
    return load_manifest_text(text + "caching:\n" + caching, file="m.yaml")


@pytest.mark.parametrize(
    "caching",
    ["", "caching:\n  pool_memory_type: uncachable\n", "caching:\n  areas: {kv: uncachable, control: uncachable}\n",
     "caching:\n  pool_memory_type: write-back\n  kv_mtrrs: 7\n"],
)
def test_without_a_split_the_layout_hash_is_unchanged(caching):
    layout = resolve_layout(load_manifest_text(MINIMAL + caching))
    assert layout.layout_hash == MINIMAL_HASH
    assert not layout.split and "memory_types" not in layout.canonical()


def _check_pieces(layout, budget):
    pieces = layout.kv_pieces
    assert 1 <= len(pieces) <= budget
    cursor = layout.shared_kv.offset
    for offset, size in pieces:
        assert offset == cursor and size & (size - 1) == 0 and offset % size == 0
        cursor += size
    assert cursor == layout.shared_kv.end


@pytest.mark.parametrize("budget", [1, 2, 4, 6, 8])
def test_a_split_puts_the_kv_area_on_at_most_kv_mtrrs_pieces_and_nothing_else_in_them(budget):
    layout = resolve_layout(_split(caching=f"  memory_types: seeds\n  kv_mtrrs: {budget}\n"))
    assert layout.split and layout.area_type("kv") == "uncachable" and layout.area_type("control") == "write-back"
    _check_pieces(layout, budget)
    kv = layout.shared_kv
    for extent in [*layout.control_extents, *layout.partitions]:
        assert extent.end <= kv.offset or extent.offset >= kv.end  # the CPU's areas stay write-back
    assert max(p.end for p in layout.partitions) <= kv.offset
    assert kv.end <= layout.pool_size


def test_more_pieces_leave_less_of_the_pool_unused():
    unused = [resolve_layout(_split(caching=f"  memory_types: seeds\n  kv_mtrrs: {n}\n")).unused for n in (2, 4, 8)]
    assert unused[0] > unused[1] > unused[2]
    # 64 GiB with four pieces: [4, 8), [8, 16), [16, 32), [32, 64) GiB
    four = resolve_layout(_split())
    assert four.kv_pieces == [(4 * GiB, 4 * GiB), (8 * GiB, 8 * GiB), (16 * GiB, 16 * GiB), (32 * GiB, 32 * GiB)]


def test_a_split_changes_the_hash_and_says_the_types_in_every_row():
    plain = resolve_layout(load_manifest_text(RACK))
    layout = resolve_layout(_split())
    assert layout.layout_hash != plain.layout_hash
    rows = list(layout.regions())
    assert rows[0].offset == 0 and rows[-1].end == layout.pool_size
    for before, after in zip(rows, rows[1:], strict=False):
        assert before.end == after.offset
    by_name = {r.name: r for r in rows}
    assert "uncachable" in by_name["shared-kv"].detail and "4 MTRR piece(s)" in by_name["shared-kv"].detail
    for name in ("header", "rpc-rings", "journal", "partition:a", "kv-align"):
        assert "write-back" in by_name[name].detail, name
    data = layout.to_dict()
    assert data["memory_types"] == {"kv": "uncachable", "control": "write-back"}
    assert data["kv_mtrr_pieces"][0] == {"offset": 4 * GiB, "size": 4 * GiB}


def test_an_explicit_shared_kv_size_is_kept_exactly_on_its_fewest_pieces():
    layout = resolve_layout(_split(RACK.replace("shared_kv: rest", "shared_kv: 48GiB")))
    assert layout.shared_kv.size == 48 * GiB and len(layout.kv_pieces) == 2


def test_an_explicit_size_needing_more_pieces_than_kv_mtrrs_is_refused_with_a_line():
    with pytest.raises(ManifestError) as info:
        _split(RACK.replace("shared_kv: rest", "shared_kv: 48998MiB"))
    text = str(info.value.problems[0])
    assert text.startswith("m.yaml:") and text.split(":")[1].isdigit()
    assert "shared_kv" in text and "kv_mtrrs allows 4" in text and "powers of two" in text


def test_mtrr_pieces_examples():
    assert mtrr_pieces(0, 8 * GiB) == [(0, 8 * GiB)]
    assert mtrr_pieces(2 * MiB, 6 * MiB) == [(2 * MiB, 2 * MiB), (4 * MiB, 4 * MiB)]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_only_a_split_puts_the_partitions_before_the_kv_area(path):
    # setup reads the split from the header's offsets this way (workflows/setup/topics/mtrr.py)
    layout = resolve_layout(load_manifest(path))
    assert split_geometry(layout.shared_kv.offset, [p.offset for p in layout.partitions]) == layout.split
    split = resolve_layout(_split())
    assert split_geometry(split.shared_kv.offset, [p.offset for p in split.partitions])
