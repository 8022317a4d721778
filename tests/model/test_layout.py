"""The pool layout: derived from the manifest alone, aligned, contiguous, and hashed."""

import dataclasses

import pytest

from belugactl.model.layout import RING_ALIGN, LayoutDoesNotFit, resolve_layout, workers_per_instance
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
    processes = sum(m.instances_on(h) * (1 + workers_per_instance(m, h)) for h in m.hosts)  # scheduler + workers
    assert rpc.ring_count == processes + md.spare_rings
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
    m = load_manifest(EXAMPLES / "beluga-rack.yaml")  # 16 hosts x 8 instances x 1 GPU
    layout = resolve_layout(m)
    assert len(layout.clients) == 16 * 8 * 2  # a scheduler and one worker per instance
    assert layout.rpc.ring_count == 256 + m.layout.metadata.spare_rings
    assert layout.spare_rings == range(256, 272)
    assert layout.ring_for("beluga-00", 0) == 0
    assert layout.ring_for("beluga-00", 0, "worker0") == 1
    assert layout.ring_for("beluga-01", 0) == 16
    assert layout.rings_of("beluga-15", 7) == {"scheduler": 254, "worker0": 255}
    assert len({c.ring for c in layout.clients}) == len(layout.clients)
    assert [c.ring for c in layout.clients] == list(range(256))
    owners = {(c.host, c.instance, c.process) for c in layout.clients}
    assert len(owners) == 256 and ("beluga-07", 3, "worker0") in owners
    with pytest.raises(KeyError):
        layout.ring_for("beluga-00", 8)
    with pytest.raises(KeyError):
        layout.ring_for("beluga-00", 0, "worker1")
    with pytest.raises(IndexError):
        PoolGeometry.from_layout(layout).slot_offset(0, layout.rpc.slots_per_ring)
    with pytest.raises(KeyError):
        layout.partition_for("nobody")


def test_one_host_cpu_demo_rings_per_process():
    m = load_manifest(EXAMPLES / "cpu-demo.yaml")  # one CPU host, two instances: one worker each
    layout = resolve_layout(m)
    assert [(c.host, c.instance, c.process, c.ring) for c in layout.clients] == [
        ("cpu-demo", 0, "scheduler", 0),
        ("cpu-demo", 0, "worker0", 1),
        ("cpu-demo", 1, "scheduler", 2),
        ("cpu-demo", 1, "worker0", 3),
    ]
    assert layout.rpc.ring_count == 4 + 2  # the spare rings stay
    data = layout.to_dict()
    assert data["clients"][1] == {"host": "cpu-demo", "instance": 0, "process": "worker0", "ring": 1}
    assert data["spare_rings"] == [4, 5]


def _tensor_parallel_rack(gpus_per_instance: int, hosts: int) -> str:
    host_entries = "".join(
        f"""  - name: g{i}
    address: 10.0.0.{i + 1}
    roles: [{"metadata, " if i == 0 else ""}worker]
    platform: gpu
    gpus: {{count: 8}}
"""
        for i in range(hosts)
    )
    return f"""version: 1
name: tp-rack
pool:
  source: {{kind: dax-device, device: dax0.0}}
  size: 4GiB
layout:
  metadata: {{slots_per_ring: 16, slot_size: 256B, spare_rings: 3, journal: 4MiB}}
  shared_kv: 50%
hosts:
{host_entries}serve:
  vllm:
    model: org/model
    instances_per_host: {8 // gpus_per_instance}
    gpus_per_instance: {gpus_per_instance}
"""


@pytest.mark.parametrize(("hosts", "gpi"), [(1, 4), (16, 8), (16, 2)])
def test_tensor_parallel_instances_get_a_ring_per_rank(hosts, gpi):
    m = load_manifest_text(_tensor_parallel_rack(gpi, hosts))
    layout = resolve_layout(m)
    per_host = 8 // gpi
    assert len(layout.clients) == hosts * per_host * (1 + gpi)
    assert layout.rpc.ring_count == len(layout.clients) + 3
    last = f"g{hosts - 1}"
    rings = layout.rings_of(last, per_host - 1)
    assert list(rings) == ["scheduler", *(f"worker{r}" for r in range(gpi))]
    assert list(rings.values()) == list(range(len(layout.clients) - 1 - gpi, len(layout.clients)))
    assert len({c.ring for c in layout.clients}) == len(layout.clients)


def test_the_per_instance_layout_of_older_belugactl_is_recognised(tmp_path):
    from belugactl.model.layout import legacy_layout_hash, stale_layout_note

    # The CPU demo as that version shipped it (its slots were 256 B then).
    text = (EXAMPLES / "cpu-demo.yaml").read_text()
    assert "slot_size: 4KiB" in text
    (tmp_path / "cpu-demo.yaml").write_text(text.replace("slot_size: 4KiB", "slot_size: 256B"))
    m = load_manifest(tmp_path / "cpu-demo.yaml")
    layout = resolve_layout(m)
    # The hash belugactl wrote for this manifest before rings were allotted per process (computed by
    # that version): a pool with it in its header is told apart from any other mismatch.
    old = "37929c92b1ce07bbe97051f55bf21f47d51d6ce523401301c5e68de692b1b80e"
    assert legacy_layout_hash(m) == old != layout.layout_hash
    note = stale_layout_note(m, layout, old, 4)
    assert note is not None and "older belugactl" in note and "every vLLM process its own ring" in note
    assert "6 (4 vLLM processes + 2 spare)" in note
    fewer = stale_layout_note(m, layout, "ab" * 32, 5)
    assert fewer is not None and "5 CXL-RPC rings, fewer than" in fewer
    assert stale_layout_note(m, layout, "ab" * 32, 6) is None  # another difference: the field diff says it
    assert stale_layout_note(m, layout, layout.layout_hash, 6) is None


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
