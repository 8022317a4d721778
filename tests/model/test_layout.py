"""The pool layout: derived from the manifest alone, aligned, contiguous, and hashed."""

import dataclasses

import pytest

from belugactl.model.layout import RING_ALIGN, LayoutDoesNotFit, resolve_layout
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.pool.geometry import PoolGeometry
from belugactl.units import MiB
from tests.support.manifests import EXAMPLES, MINIMAL

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_regions_are_aligned_contiguous_and_cover_the_pool(path):
    m = load_manifest(path)
    layout = resolve_layout(m)
    regions = list(layout.regions())
    assert regions[0].offset == 0
    for before, after in zip(regions, regions[1:], strict=False):
        assert before.end == after.offset
    assert regions[-1].end == layout.pool_size == m.pool.size
    for region in regions:
        assert region.offset % layout.align == 0 and region.size % layout.align == 0
        assert region.size > 0
    assert [p.host for p in layout.partitions] == m.host_names()
    assert [p.index for p in layout.partitions] == list(range(len(m.hosts)))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_rpc_rings_fit_the_metadata_area(path):
    m = load_manifest(path)
    layout = resolve_layout(m)
    md = m.layout.metadata
    rpc = layout.rpc
    assert rpc.ring_count == sum(m.instances_on(h) for h in m.hosts) + md.spare_rings
    assert rpc.slot_size % 64 == 0
    assert rpc.ring_stride % RING_ALIGN == 0 and rpc.ring_stride >= md.slots_per_ring * md.slot_size
    geometry = PoolGeometry.from_layout(layout)
    last_slot_end = geometry.slot_offset(rpc.ring_count - 1, rpc.slots_per_ring - 1) + rpc.slot_size
    assert layout.metadata.offset == layout.header.end == rpc.offset
    assert last_slot_end <= layout.journal.offset
    assert layout.journal.end == layout.metadata.end == layout.shared_kv.offset
    assert layout.journal.size == md.journal


def test_lab_equal_split():
    m = load_manifest(EXAMPLES / "lab.yaml")
    layout = resolve_layout(m)
    remaining = m.pool.size - layout.shared_kv.end
    assert [p.size for p in layout.partitions] == [remaining // 2] * 2
    assert layout.partition_for("lab-2").end == m.pool.size


def test_equal_split_rounds_down_to_the_align():
    m = load_manifest_text(MINIMAL.replace("shared_kv: 254MiB", "shared_kv: 252MiB"))
    layout = resolve_layout(m)
    # 510 - 2 (header) - 2 (rings) - 4 (journal) - 252 = 250 MiB for 2 hosts: 125 MiB is not 2 MiB aligned
    assert [p.size for p in layout.partitions] == [124 * MiB, 124 * MiB]
    assert layout.unused == 2 * MiB
    assert list(layout.regions())[-1].kind == "unused"


def test_shared_rest_takes_what_partitions_leave():
    m = load_manifest_text(
        MINIMAL.replace("shared_kv: 254MiB\n  partition_size: equal", "shared_kv: rest\n  partition_size: 100MiB")
    )
    layout = resolve_layout(m)
    assert [p.size for p in layout.partitions] == [100 * MiB, 100 * MiB]
    assert layout.shared_kv.size == m.pool.size - layout.metadata.end - 200 * MiB
    assert layout.unused == 0


def test_per_host_partition_size_overrides_the_equal_split():
    text = MINIMAL.replace(
        "    platform: cpu\n  - name: h2", "    platform: cpu\n    partition_size: 20MiB\n  - name: h2"
    )
    layout = resolve_layout(load_manifest_text(text))
    assert layout.partition_for("h1").size == 20 * MiB
    assert layout.partition_for("h2").size == 510 * MiB - 8 * MiB - 254 * MiB - 20 * MiB


def test_percent_shared_kv():
    layout = resolve_layout(load_manifest_text(MINIMAL.replace("shared_kv: 254MiB", "shared_kv: 50%")))
    after_metadata = 510 * MiB - layout.metadata.end
    assert layout.shared_kv.size == after_metadata // 2 // (2 * MiB) * (2 * MiB)


def test_clients_and_rings():
    m = load_manifest(EXAMPLES / "beluga-rack.yaml")
    layout = resolve_layout(m)
    assert len(layout.clients) == 128
    assert layout.ring_for("beluga-00", 0) == 0
    assert layout.ring_for("beluga-01", 0) == 8
    assert len({c.ring for c in layout.clients}) == len(layout.clients)
    with pytest.raises(KeyError):
        layout.ring_for("beluga-00", 8)
    with pytest.raises(IndexError):
        PoolGeometry.from_layout(layout).slot_offset(0, layout.rpc.slots_per_ring)
    with pytest.raises(KeyError):
        layout.partition_for("nobody")


def test_layout_is_deterministic():
    a = resolve_layout(load_manifest(EXAMPLES / "beluga-rack.yaml"))
    b = resolve_layout(load_manifest(EXAMPLES / "beluga-rack.yaml"))
    assert a == b
    assert a.layout_hash == b.layout_hash
    assert len(a.layout_hash) == 64


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("shared_kv: 254MiB", "shared_kv: 250MiB"),
        ("  - name: h2", "  - name: h3"),
        ("version: 1\n", "version: 1\n"),  # control: must NOT change the hash
    ],
)
def test_layout_hash_tracks_every_contract_field(old, new):
    base = resolve_layout(load_manifest_text(MINIMAL))
    changed = resolve_layout(load_manifest_text(MINIMAL.replace(old, new)))
    assert (base.layout_hash == changed.layout_hash) == (old == new)


def test_layout_hash_ignores_fields_that_are_not_offsets():
    base = resolve_layout(load_manifest_text(MINIMAL))
    other = resolve_layout(load_manifest_text(MINIMAL.replace("address: 10.0.0.2", "address: 10.9.9.9")))
    assert base.layout_hash == other.layout_hash


def test_host_order_changes_the_hash():
    swapped = MINIMAL.replace("  - name: h1\n", "  - name: TMP\n").replace("  - name: h2\n", "  - name: h1\n")
    swapped = swapped.replace("  - name: TMP\n", "  - name: h2\n")
    assert (
        resolve_layout(load_manifest_text(swapped)).layout_hash
        != resolve_layout(load_manifest_text(MINIMAL)).layout_hash
    )


def test_to_dict_is_json_ready():
    import json

    layout = resolve_layout(load_manifest(EXAMPLES / "lab.yaml"))
    data = json.loads(json.dumps(layout.to_dict()))
    assert data["layout_hash"] == layout.layout_hash
    assert [r["name"] for r in data["regions"]][:4] == ["header", "rpc-rings", "journal", "shared-kv"]


def test_resolve_layout_refuses_a_manifest_that_does_not_fit():
    # A Manifest built in code skips the loader's rules; resolve_layout still refuses.
    m = load_manifest_text(MINIMAL)
    too_big = m.model_copy(update={"layout": m.layout.model_copy(update={"shared_kv": 600 * MiB})})
    with pytest.raises(LayoutDoesNotFit) as info:
        resolve_layout(too_big)
    assert info.value.path == ("layout", "shared_kv")


def test_partition_dataclasses_are_frozen():
    layout = resolve_layout(load_manifest_text(MINIMAL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.partitions[0].size = 0  # type: ignore[misc]


def test_software_stripes_for_the_beluga_rack():
    from belugactl.model.layout import software_stripes

    m = load_manifest(EXAMPLES / "beluga-rack.yaml")
    stripes = software_stripes(m)
    assert stripes is not None and stripes.ways == 32 and stripes.granularity == 2 * MiB
    assert stripes.device_size * stripes.ways == m.pool.size
    assert stripes.device_of(0) == 0 and stripes.device_of(m.pool.size - 1) == 31
    assert stripes.device_of(stripes.device_size) == 1
    assert stripes.stripe_start(3 * MiB) == 2 * MiB
    assert software_stripes(load_manifest(EXAMPLES / "lab.yaml")) is None


def test_by_default_partitions_hold_one_align_unit_and_the_shared_area_the_rest():
    """Partitions carry belugactl's per-host records only; KV blocks go to the shared area
    (docs/pool-format.md, "Per-host partitions")."""
    text = MINIMAL.replace("layout:\n  shared_kv: 254MiB\n  partition_size: equal\n", "")
    assert "shared_kv" not in text and "partition_size" not in text
    m = load_manifest_text(text)
    layout = resolve_layout(m)
    assert [p.size for p in layout.partitions] == [m.pool.align, m.pool.align]
    assert layout.shared_kv.offset == layout.metadata.end
    assert layout.shared_kv.size == m.pool.size - layout.metadata.end - 2 * m.pool.align
    assert layout.partitions[-1].end == m.pool.size
    # The old default, written out, still gives the old layout.
    old = load_manifest_text(MINIMAL.replace("shared_kv: 254MiB", "shared_kv: 50%"))
    assert resolve_layout(old).partitions[0].size > m.pool.align
