"""A pool laid out with layout.capacity keeps its bytes across a change of hosts (issue 32, item 3).

A real file pool, the real header code: hosts join, leave and are replaced by rewriting the header's
host table in place; the shared KV area's bytes and the epoch are checked after every step, and a
change of geometry (or a host that would change slots) is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from belugactl.errors import InputError, PoolMismatch, StepFailed, UsageError
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.pool import header as hdr
from belugactl.pool import membership
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.pool_members import record_file_members
from belugactl.workflows.rack_context import load_rack_context

REPO = Path(__file__).resolve().parents[2]
BASE = (REPO / "examples" / "cpu-demo.yaml").read_text()
CAPACITY = "  partition_size: 64MiB\n  capacity: {hosts: 4, rings_per_host: 6}\n"
WIDER = CAPACITY.replace("rings_per_host: 6", "rings_per_host: 8")
PLAIN = "  partition_size: 64MiB\n"  # no capacity: format 1
NUMA = "numa: {cpu_nodes: 1, cxl_nodes: 0, cxl_node_cpuless: false}"


def rack_text(*extra_hosts: str, first: bool = True, instances: int = 2, capacity: str = CAPACITY) -> str:
    text = BASE.replace("  partition_size: 64MiB\n", capacity)
    text = text.replace("    instances: 2\n", f"    instances: {instances}\n")
    if not first:  # drop the first host (cpu-demo) from the list
        start = text.index("  - name: cpu-demo")
        text = text[:start] + text[text.index("    instances:", start) :].split("\n", 1)[1]
    hosts = "".join(f"  - {{name: {h}, address: 127.0.0.2, platform: cpu, {NUMA}}}\n" for h in extra_hosts)
    if not first:  # the first host left with the metadata role; the next one takes it
        hosts = hosts.replace("platform: cpu", "platform: cpu, roles: [metadata, worker]", 1)
    return text.replace("\ncaching:", hosts + "\ncaching:", 1)


def with_slot(text: str, host: str, slot: int) -> str:
    return text.replace(f"{{name: {host}, ", f"{{name: {host}, slot: {slot}, ")


def rack_file(tmp_path: Path, text: str, name: str = "rack.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rack(tmp_path: Path, text: str) -> object:
    return load_rack_context(rack_file(tmp_path, text), host="cpu-demo" if "  - name: cpu-demo" in text else None)


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    path = create_file_pool(tmp_path / "cap.pool", load_manifest_text(rack_text()))
    with PoolMapping.open(path, load_manifest_text(rack_text())) as mapping:
        kv = mapping.header.geometry.shared_kv_offset
        mapping.write(kv, PATTERN)
        mapping.write(kv + (256 << 20), PATTERN)
        for _ in range(7):  # seven metadata-server starts
            mapping.bump_epoch()
    return path


PATTERN = os.urandom(1 << 16)


def assert_kept(path: Path, text: str) -> hdr.PoolHeader:
    """The pool maps under this manifest, the shared KV bytes and the epoch are as written."""
    with PoolMapping.open(path, load_manifest_text(text), writable=False) as mapping:
        kv = mapping.header.geometry.shared_kv_offset
        assert mapping.read(kv, len(PATTERN)) == PATTERN
        assert mapping.read(kv + (256 << 20), len(PATTERN)) == PATTERN
        assert mapping.epoch() == 7
        return mapping.header


def test_hosts_instances_and_tp_within_capacity_keep_the_layout_hash() -> None:
    one = resolve_layout(load_manifest_text(rack_text()))
    assert one.format_version == 2 and one.rpc.ring_count == 4 * 6 + 2 and list(one.spare_rings) == [24, 25]
    two = resolve_layout(load_manifest_text(rack_text("cpu-two", instances=3)))
    assert two.layout_hash == one.layout_hash
    # cpu-two sits in slot 1: its rings start at 6 and its partition is slot 1's extent
    assert two.ring_for("cpu-two", 0, "scheduler") == 6 and two.ring_for("cpu-demo", 2, "worker0") == 5
    assert two.partition_for("cpu-two").offset == one.slots[1].offset
    assert [r.owner for r in two.regions() if r.kind == "partition"] == ["cpu-demo", "cpu-two", "-", "-"]
    bigger = resolve_layout(load_manifest_text(rack_text(capacity=WIDER)))
    assert bigger.layout_hash != one.layout_hash  # the ring capacity is geometry
    # without a capacity the hash covers the hosts (format 1, as it always was)
    plain = [resolve_layout(load_manifest_text(rack_text(*h, capacity=PLAIN))) for h in ((), ("x",))]
    assert plain[0].format_version == 1 and plain[0].layout_hash != plain[1].layout_hash


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (rack_text(instances=4), "8 vLLM processes"),
        (with_slot(rack_text("cpu-two"), "cpu-two", 0), "slot 0 is already cpu-demo's"),
        (with_slot(rack_text("cpu-two"), "cpu-two", 4), "outside capacity.hosts"),
        (with_slot(rack_text("cpu-two"), "cpu-two", -1), "outside capacity.hosts"),
        (rack_text("a", "b", "c", "d"), "5 hosts do not fit 4 slots"),
        (with_slot(rack_text("cpu-two", capacity=PLAIN), "cpu-two", 1), "a slot needs layout.capacity"),
    ],
)
def test_manifest_rules_refuse_what_the_capacity_cannot_hold(text: str, message: str) -> None:
    from belugactl.errors import ManifestError

    with pytest.raises(ManifestError) as caught:
        load_manifest_text(text)
    assert message in str(caught.value.to_dict())


def test_a_host_joins_leaves_and_is_replaced_keeping_every_byte(pool: Path, tmp_path: Path) -> None:
    joined = rack_text("cpu-two")
    with pytest.raises(PoolMismatch) as caught:  # serve and every other mapper refuse until it is recorded
        PoolMapping.open(pool, load_manifest_text(joined), writable=False)
    assert "another membership" in caught.value.what and "host cpu-two joins in slot 1" in caught.value.what
    assert "pool members" in caught.value.fix and "keeps every cached KV block" in caught.value.fix

    before = pool.read_bytes()[: hdr.HEADER_REGION]
    dry = record_file_members(pool, rack(tmp_path, joined), dry_run=True, force=False)
    assert dry.change is not None and dry.change.added == (("cpu-two", 1),) and dry.written is None
    assert pool.read_bytes()[: hdr.HEADER_REGION] == before  # a dry run writes nothing

    done = record_file_members(pool, rack(tmp_path, joined), dry_run=False, force=False)
    assert done.written is not None and done.written.members_version == 1 and done.written.members_epoch == 7
    header = assert_kept(pool, joined)
    assert [h.name for h in header.hosts] == ["cpu-demo", "cpu-two"]
    with pytest.raises(PoolMismatch):  # the old manifest is now the stale one
        PoolMapping.open(pool, load_manifest_text(rack_text()), writable=False)
    # again: nothing to do (idempotent)
    assert record_file_members(pool, rack(tmp_path, joined), dry_run=False, force=False).change is None

    # more instances within the ring capacity change no byte on media
    assert_kept(pool, rack_text("cpu-two", instances=3))

    # replace cpu-two by cpu-three in slot 1
    replaced = rack_text("cpu-three")
    change = record_file_members(pool, rack(tmp_path, replaced), dry_run=False, force=False).change
    assert change is not None and change.replaced == ((1, "cpu-two", "cpu-three"),) and not change.added
    assert assert_kept(pool, replaced).members_version == 2

    # cpu-demo leaves; cpu-three, pinned to its slot, stays where it is
    left = with_slot(rack_text("cpu-three", first=False), "cpu-three", 1)
    change = record_file_members(pool, rack(tmp_path, left), dry_run=False, force=False).change
    assert change is not None and change.removed == (("cpu-demo", 0),) and not change.moved
    header = assert_kept(pool, left)
    assert [h.name for h in header.hosts] == ["cpu-three"] and header.members_version == 3


def test_a_host_that_would_change_slots_needs_force(pool: Path, tmp_path: Path) -> None:
    record_file_members(pool, rack(tmp_path, rack_text("cpu-two")), dry_run=False, force=False)
    unpinned = rack_text("cpu-two", first=False)  # cpu-two moves up to slot 0
    with pytest.raises(UsageError) as caught:
        record_file_members(pool, rack(tmp_path, unpinned), dry_run=False, force=False)
    assert "cpu-two (slot 1 -> 0)" in caught.value.what and "slot: N" in (caught.value.fix or "")
    assert assert_kept(pool, rack_text("cpu-two")).members_version == 1  # nothing was changed
    change = record_file_members(pool, rack(tmp_path, unpinned), dry_run=False, force=True).change
    assert change is not None and change.moved == (("cpu-two", 1, 0),) and change.removed == (("cpu-demo", 0),)
    assert_kept(pool, unpinned)


def test_another_geometry_is_not_a_membership_change(pool: Path, tmp_path: Path) -> None:
    other = rack_text(capacity=WIDER)
    with pytest.raises(PoolMismatch) as caught:
        record_file_members(pool, rack(tmp_path, other), dry_run=False, force=False)
    assert "not a membership change" in caught.value.what and "rpc_ring_count" in (caught.value.why or "")
    assert "DESTROYS" in caught.value.fix
    assert_kept(pool, rack_text())


def test_a_record_made_from_a_stale_plan_is_refused(pool: Path) -> None:
    joined = load_manifest_text(rack_text("cpu-two"))
    layout = resolve_layout(joined)
    ours = hdr.PoolHeader.from_layout(joined, layout, created_by="t")
    with PoolMapping.open(pool, load_manifest_text(rack_text())) as mapping:
        planned = mapping.header
        membership.record(mapping, ours, planned, layout)  # the first writer
        other = load_manifest_text(rack_text("cpu-four"))
        theirs = hdr.PoolHeader.from_layout(other, resolve_layout(other), created_by="t")
        with pytest.raises(StepFailed) as caught:
            membership.record(mapping, theirs, planned, resolve_layout(other))  # planned at 0, the pool is at 1
    assert "changed while setup ran" in caught.value.what
    assert [h.name for h in assert_kept(pool, rack_text("cpu-two")).hosts] == ["cpu-demo", "cpu-two"]


def test_a_reader_reads_again_over_a_half_written_record(pool: Path) -> None:
    good = pool.read_bytes()[: hdr.MAX_HEADER_SIZE]
    torn = bytearray(good)
    torn[hdr.FIXED_SIZE] ^= 0xFF  # the host table rewritten, the crc not yet
    reads = [bytes(torn), bytes(torn), good]
    assert membership.read_header(lambda off, n: reads.pop(0)).pool_uuid
    longer = bytearray(good)
    longer[12:16] = (hdr.FIXED_SIZE + 2 * hdr.HOST_ENTRY_SIZE).to_bytes(4, "little")  # a new length, old count
    reads = [bytes(longer), good]
    assert membership.read_header(lambda off, n: reads.pop(0)).pool_uuid
    with pytest.raises(InputError, match="crc mismatch"):  # a record that stays torn is reported
        membership.read_header(lambda off, n: bytes(torn))
    version_one = bytearray(good)
    version_one[8] = 1  # a format 1 record must keep the membership words zero
    with pytest.raises(InputError):
        hdr.PoolHeader.unpack(bytes(version_one))


def test_setup_plans_a_membership_step_that_keeps_the_cache(pool: Path) -> None:
    from belugactl.workflows.setup.target import header_spec_for
    from belugactl.workflows.setup.topics import header as topic

    found = pool.read_bytes()[: hdr.HEADER_REGION]
    joined = load_manifest_text(rack_text("cpu-two"))
    spec = header_spec_for(joined, resolve_layout(joined), "cpu-demo")
    verdict = topic.judge(spec, found)
    assert verdict.state == "members" and verdict.members is not None
    step = topic._step_for(verdict, spec, "/dev/dax0.0")
    assert step.id == "header.members" and not step.destroys_data and step.refusal is None
    assert "host cpu-two joins in slot 1" in step.summary and "keeps every cached KV block" in step.summary
    with PoolMapping.open(pool, load_manifest_text(rack_text())) as mapping:
        membership.record(mapping, spec.ours, mapping.header, spec.layout)
    found = pool.read_bytes()[: hdr.HEADER_REGION]
    assert topic.judge(spec, found).state == "match"
    moved = load_manifest_text(rack_text("cpu-two", first=False))  # cpu-two would move to slot 0
    moved_spec = header_spec_for(moved, resolve_layout(moved), "cpu-two")
    step = topic._step_for(topic.judge(moved_spec, found), moved_spec, "/dev/dax0.0")
    assert step.destroys_data and step.refusal is not None and "slot: N" in (step.refusal.fix or "")


@pytest.mark.process
def test_pool_members_cli(pool: Path, tmp_path: Path) -> None:
    def run(text: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = rack_file(tmp_path, text, "cli.yaml")
        return subprocess.run([sys.executable, "-m", "belugactl", "pool", "members", str(pool), "-f", str(path), *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    dry = run(rack_text("cpu-two"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would record membership version 1" in dry.stdout and "host cpu-two joins in slot 1" in dry.stdout
    bad = run(rack_text(capacity=WIDER))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "not a membership change" in bad.stderr
    path = rack_file(tmp_path, rack_text("cpu-two"), "cli.yaml")
    folder = subprocess.run([sys.executable, "-m", "belugactl", "pool", "members", str(tmp_path), "-f", str(path)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert folder.returncode == 2 and "not a regular file" in folder.stderr and "Traceback" not in folder.stderr
    done = run(rack_text("cpu-two"), "--json")
    assert done.returncode == 0, done.stderr
    assert '"members_version": 1' in done.stdout
    assert_kept(pool, rack_text("cpu-two"))


@pytest.mark.process
def test_blocks_saved_before_a_host_joins_are_served_to_it_afterwards(tmp_path: Path) -> None:
    """A real metadata server, journal restart policy: blocks saved through cpu-demo's ring, the rack
    grows by a host (membership recorded in place), the server restarts under the new manifest and the
    new host's own ring (slot 1's first) reads every block back, byte for byte."""
    from belugactl.dataplane import native
    from belugactl.dataplane.client import connect
    from tests.support.mds_process import start_mds

    before = rack_file(tmp_path, rack_text(), "before.yaml")
    after = rack_file(tmp_path, rack_text("cpu-two"), "after.yaml")
    pool = create_file_pool(tmp_path / "cap.pool", load_manifest_text(rack_text()))
    blocks = {os.urandom(32): os.urandom(96 * 1024) for _ in range(40)}
    common = ("--fence-grace", "0", "--restart-policy", "journal")
    with start_mds(before, pool, *common) as m:
        mapping = PoolMapping.open(pool, load_manifest_text(rack_text()))
        writer = connect(m.cxl(resolve_layout(load_manifest_text(rack_text())).ring_for("cpu-demo", 0)), pool=mapping,
                         timeout_s=5)  # fmt: skip
        for key, data in blocks.items():
            r = writer.reserve("m/tp0", key, len(data))
            done = 0
            for off, n in r.extents:
                mapping.write(off, data[done : done + n])
                done += n
            writer.commit(r.token, native.crc32c(data))
        writer.close()
        mapping.close()
    with pytest.raises(PoolMismatch):  # not yet recorded: the new manifest's server refuses the pool
        PoolMapping.open(pool, load_manifest_text(rack_text("cpu-two")), writable=False)
    record_file_members(pool, load_rack_context(after, host="cpu-demo"), dry_run=False, force=False)
    layout = resolve_layout(load_manifest_text(rack_text("cpu-two")))
    ring = layout.ring_for("cpu-two", 0)
    assert ring == 6
    with start_mds(after, pool, *common) as m:
        mapping = PoolMapping.open(pool, load_manifest_text(rack_text("cpu-two")))
        reader = connect(m.cxl(ring), pool=mapping, timeout_s=5)
        assert reader.lookup_prefix("m/tp0", list(blocks)) == len(blocks)
        for key, data in blocks.items():
            loc = reader.get("m/tp0", key)
            assert loc is not None and loc.checksum == native.crc32c(data)
            got = b"".join(mapping.read(off, n) for off, n in loc.extents)
            assert got[: len(data)] == data
        reader.close()
        mapping.close()


def test_a_format_1_pool_whose_offsets_a_capacity_keeps_migrates_in_place(tmp_path: Path) -> None:
    plain = rack_text(capacity=PLAIN)  # 1 host, 2 instances x 2 processes, 2 spare: 6 rings
    kept = rack_text(capacity=PLAIN + "  capacity: {hosts: 1, rings_per_host: 4}\n")
    path = create_file_pool(tmp_path / "old.pool", load_manifest_text(plain))
    with PoolMapping.open(path, load_manifest_text(plain)) as mapping:
        kv = mapping.header.geometry.shared_kv_offset
        mapping.write(kv, PATTERN)
        mapping.write(kv + (256 << 20), PATTERN)
        for _ in range(7):
            mapping.bump_epoch()
    old, new = resolve_layout(load_manifest_text(plain)), resolve_layout(load_manifest_text(kept))
    assert [(r.offset, r.size) for r in old.regions()] == [(r.offset, r.size) for r in new.regions()]
    assert old.layout_hash != new.layout_hash and old.format_version == 1 and new.format_version == 2
    with pytest.raises(PoolMismatch) as caught:
        PoolMapping.open(path, load_manifest_text(kept), writable=False)
    assert "moves to format 2" in caught.value.what
    change = record_file_members(path, rack(tmp_path, kept), dry_run=False, force=False).change
    assert change is not None and change.migrate
    header = assert_kept(path, kept)
    assert header.format_version == 2 and header.members_version == 1
    # from here on it is a capacity pool: a grown capacity is a new layout, refused as such
    wider = rack_text(capacity=PLAIN + "  capacity: {hosts: 2, rings_per_host: 4}\n")
    with pytest.raises(PoolMismatch, match="not a membership change"):
        record_file_members(path, rack(tmp_path, wider), dry_run=True, force=False)
    # and a capacity that would move a region is no migration: the pool stays as it was
    path2 = create_file_pool(tmp_path / "old2.pool", load_manifest_text(plain))
    with pytest.raises(PoolMismatch, match="not a membership change"):
        record_file_members(path2, rack(tmp_path, wider), dry_run=False, force=False)
    assert hdr.PoolHeader.unpack(path2.read_bytes()[: hdr.MAX_HEADER_SIZE]).format_version == 1


def test_a_rewrite_a_crash_interrupted_is_finished_not_lost(pool: Path, tmp_path: Path) -> None:
    """The writer dies after the host table, before the identity part and its crc: the header at offset
    0 is unreadable, the staged record says what it was going to be; the next record finishes it."""
    joined = load_manifest_text(rack_text("cpu-two"))
    ours = hdr.PoolHeader.from_layout(joined, resolve_layout(joined), created_by="t")
    with PoolMapping.open(pool, load_manifest_text(rack_text())) as mapping:
        current = mapping.header
        new = replace(current, hosts=ours.hosts, members_version=1, members_epoch=mapping.epoch())
        data = new.pack()
        mapping.write(membership.STAGE_OFFSET, data)
        mapping.write(hdr.MEMBERS_OFFSET, data[hdr.MEMBERS_OFFSET :])  # ... and the crash
    with pytest.raises(PoolMismatch) as caught:
        PoolMapping.open(pool, joined, writable=False)
    assert "interrupted" in caught.value.what and "setup" in (caught.value.fix or "")
    # setup plans to finish it, without --force
    from belugactl.workflows.setup.target import header_spec_for
    from belugactl.workflows.setup.topics import header as topic

    spec = header_spec_for(joined, resolve_layout(joined), "cpu-demo")
    verdict = topic.judge(spec, pool.read_bytes()[: hdr.HEADER_REGION])
    step = topic._step_for(verdict, spec, "/dev/dax0.0")
    assert verdict.state == "interrupted" and step.id == "header.members" and not step.destroys_data
    outcome = record_file_members(pool, rack(tmp_path, rack_text("cpu-two")), dry_run=False, force=False)
    assert outcome.change is None  # finishing it was all there was to do
    header = assert_kept(pool, rack_text("cpu-two"))
    assert header.members_version == 1 and [h.name for h in header.hosts] == ["cpu-demo", "cpu-two"]
    assert pool.read_bytes()[membership.STAGE_OFFSET : membership.STAGE_OFFSET + 64] == bytes(64)


def test_a_format_1_pool_whose_rings_a_capacity_would_renumber_is_not_migrated(tmp_path: Path) -> None:
    """Offsets alike but a process on another ring (format 1 numbered rings without gaps): refused."""
    two = rack_text("cpu-two", capacity=PLAIN).replace("    instances: 2\n", "    instances: 1\n")
    two = two.replace("{name: cpu-two, ", "{name: cpu-two, instances: 2, ")  # cpu-demo 2 processes, cpu-two 4
    plain = two.replace("spare_rings: 2", "spare_rings: 4")
    cap = two.replace(PLAIN, PLAIN + "  capacity: {hosts: 2, rings_per_host: 4}\n")
    old, new = resolve_layout(load_manifest_text(plain)), resolve_layout(load_manifest_text(cap))
    assert [(r.offset, r.size) for r in old.regions()] == [(r.offset, r.size) for r in new.regions()]
    assert old.ring_for("cpu-two", 0) == 2 and new.ring_for("cpu-two", 0) == 4
    path = create_file_pool(tmp_path / "old.pool", load_manifest_text(plain))
    with pytest.raises(PoolMismatch, match="not a membership change"):
        record_file_members(path, rack(tmp_path, cap), dry_run=False, force=False)


def test_a_host_table_naming_no_slot_is_not_taken_for_a_membership(pool: Path, tmp_path: Path) -> None:
    """A header of this geometry whose host entry sits at an offset that is no slot (crafted, or written
    by something else): refused as another layout, never recorded over or reported as a join."""
    import struct
    import zlib

    data = bytearray(pool.read_bytes()[: hdr.MAX_HEADER_SIZE])
    offset = struct.unpack_from("<Q", data, hdr.FIXED_SIZE + 48)[0]
    struct.pack_into("<Q", data, hdr.FIXED_SIZE + 48, offset + (2 << 20))  # half-way into slot 0
    work = bytearray(data[: struct.unpack_from("<I", data, 12)[0]])
    work[16:20] = bytes(4)
    work[hdr.CLAIM_OFFSET : hdr.EPOCH_OFFSET + 64] = bytes(hdr.EPOCH_OFFSET + 64 - hdr.CLAIM_OFFSET)
    struct.pack_into("<I", data, 16, zlib.crc32(work) & 0xFFFFFFFF)
    with pool.open("r+b") as f:
        f.write(data)
    with pytest.raises(PoolMismatch) as caught:
        PoolMapping.open(pool, load_manifest_text(rack_text("cpu-two")), writable=False)
    assert "another membership" not in caught.value.what
    with pytest.raises(PoolMismatch, match="not a membership change"):
        record_file_members(pool, rack(tmp_path, rack_text("cpu-two")), dry_run=False, force=False)
    with pytest.raises(PoolMismatch, match="not a membership change"):
        record_file_members(pool, rack(tmp_path, rack_text()), dry_run=True, force=False)
