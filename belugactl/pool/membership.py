"""The rack's membership in a pool laid out with a capacity (header format 2): who sits in which slot.

A capacity layout (model/layout.py, `layout.capacity`) fixes the geometry every host must agree on
forever: the regions, the ring capacity and the partition slots; its hash covers nothing else. Which
host uses which slot is the header's host table, and a host's CXL-RPC rings follow from its slot
(`slot * rings_per_host` onwards), so a change of hosts is a rewrite of that table in place and no
region moves: every cached KV block, the journal and the other hosts' partitions stay. A change of
instance counts or tensor-parallel sizes within `rings_per_host` changes no byte on media at all.

The table carries a version (bumped by each rewrite) and the pool epoch at its last write. The
rewrite never touches the magic, the claim and epoch lines (a metadata server may bump the epoch
meanwhile); it stages the new record at `STAGE_OFFSET` first, so a crash half-way leaves something
to finish (`recover`, run by setup and `pool members`) rather than an unreadable header; a reader that
catches the record half-written reads again (`read_header`).

A pool written by format 1 (no capacity) moves to format 2 the same way, in place, when the
capacity layout keeps every one of its offsets (`migratable`: as many slots as hosts, as many rings
per slot as each host runs processes, the same partition size and spare rings). Any other move to a
capacity layout changes where regions start: a new layout (`setup --force`), refused with what it drops.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from belugactl.errors import InputError, StepFailed
from belugactl.model.layout import CAPACITY_FORMAT_VERSION, FORMAT_VERSION, PoolLayout
from belugactl.pool import header as hdr
from belugactl.pool.header import PoolHeader

# A reader that meets a record mid-rewrite (crc mismatch) tries again this often, this far apart.
READ_TRIES = 5
READ_PAUSE_S = 0.01
# Where a rewrite stages its new record first: in the header region's first MiB, far past the record
# (at most 1,408 bytes) and before the doorbells (the second MiB); zero when no rewrite is under way.
STAGE_OFFSET = 64 * 1024


@dataclass(frozen=True)
class MembershipChange:
    """What recording this manifest's membership in the pool changes, slot by slot."""

    version: int  # the pool's membership version now; the rewrite makes it version + 1
    added: tuple[tuple[str, int], ...] = ()  # (host, slot): a free slot taken
    removed: tuple[tuple[str, int], ...] = ()  # (host, slot): the slot becomes free
    replaced: tuple[tuple[int, str, str], ...] = ()  # (slot, old host, new host)
    moved: tuple[tuple[str, int, int], ...] = ()  # (host, old slot, new slot)
    migrate: bool = False  # a format 1 header whose every offset this capacity layout keeps


    @property
    def moves_partitions(self) -> bool:
        """A host changes slots: its partition's contents stay behind in the old slot."""
        return bool(self.moved)

    @property
    def moved_text(self) -> str:
        """The hosts that change slot, for a refusal: "gpu05 (slot 5 -> 4), ..."."""
        return ", ".join(f"{h} (slot {a} -> {b})" for h, a, b in self.moved)

    def lines(self) -> list[str]:
        out = (
            ["the header moves to format 2 (layout.capacity) in place: every offset stays as it is"]
            if self.migrate
            else []
        )
        out += [f"host {h} joins in slot {s}" for h, s in self.added]
        out += [f"host {h} leaves slot {s} (the slot is free; its partition's bytes stay)" for h, s in self.removed]
        out += [f"slot {s}: host {new} replaces {old} (takes over its partition)" for s, old, new in self.replaced]
        out += [
            f"host {h} moves from slot {a} to slot {b}: its partition's contents stay in slot {a}"
            for h, a, b in self.moved
        ]
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "added": [{"host": h, "slot": s} for h, s in self.added],
            "removed": [{"host": h, "slot": s} for h, s in self.removed],
            "replaced": [{"slot": s, "old": o, "new": n} for s, o, n in self.replaced],
            "moved": [{"host": h, "from": a, "to": b} for h, a, b in self.moved],
            "migrate": self.migrate,
        }


def same_geometry(ours: PoolHeader, theirs: PoolHeader) -> bool:
    """Both capacity headers of one pool and one geometry: they can differ only in membership."""
    return (
        ours.format_version == theirs.format_version == CAPACITY_FORMAT_VERSION
        and ours.pool_uuid == theirs.pool_uuid
        and ours.layout_hash == theirs.layout_hash
    )


def migratable(ours: PoolHeader, theirs: PoolHeader, layout: PoolLayout) -> bool:
    """A format 1 header of this pool whose every offset the manifest's capacity layout (`layout`, the
    one `ours` was made from) keeps: the same regions, ring count and host partitions, and every process
    on the ring format 1 gave it (the processes in host order on rings 0, 1, 2, ...: every host but the
    last runs `rings_per_host` processes). Rewriting it as format 2 moves nothing and drops nothing."""
    if ours.format_version != CAPACITY_FORMAT_VERSION or theirs.format_version != FORMAT_VERSION:
        return False
    if ours.pool_uuid != theirs.pool_uuid or ours.hosts != theirs.hosts:
        return False
    if [c.ring for c in layout.clients] != list(range(len(layout.clients))):
        return False  # format 1 numbered the rings in host order without gaps; a gap moves a process
    a, b = ours.to_dict(), theirs.to_dict()
    return all(a[f] == b[f] for f in (*hdr.GEOMETRY_FIELDS, "rpc_ring_count") if f != "format_version")


def compare(ours: PoolHeader, theirs: PoolHeader, layout: PoolLayout) -> MembershipChange | None:
    """The membership change from the pool's header (`theirs`) to the manifest's (`ours`); None when
    they are not the same capacity geometry (a layout change, not a membership change) or when they
    already agree. Slots are told apart by their offsets, which the geometry fixes. A format 1 header
    that the capacity layout keeps every offset of is a change too (`migrate`)."""
    if migratable(ours, theirs, layout):
        return MembershipChange(theirs.members_version, migrate=True)
    if not same_geometry(ours, theirs) or ours.hosts == theirs.hosts:
        return None
    slots = {(e.offset, e.size): i for i, e in enumerate(layout.slots)}
    if any((h.offset, h.size) not in slots for h in (*theirs.hosts, *ours.hosts)):
        return None  # a partition that is no slot of this geometry: not a membership this layout made
    before = {h.name: slots[h.offset, h.size] for h in theirs.hosts}
    after = {h.name: slots[h.offset, h.size] for h in ours.hosts}
    held_before = {s: n for n, s in before.items()}
    added: list[tuple[str, int]] = []
    replaced: list[tuple[int, str, str]] = []
    moved: list[tuple[str, int, int]] = []
    for name, slot in after.items():
        if name in before:
            if before[name] != slot:
                moved.append((name, before[name], slot))
        elif slot in held_before and held_before[slot] not in after:
            replaced.append((slot, held_before[slot], name))
        else:
            added.append((name, slot))
    replaced_old = {old for _, old, _ in replaced}
    removed = [(name, slot) for name, slot in before.items() if name not in after and name not in replaced_old]
    return MembershipChange(
        theirs.members_version, tuple(sorted(added, key=lambda x: x[1])), tuple(sorted(removed, key=lambda x: x[1])),
        tuple(sorted(replaced)), tuple(sorted(moved, key=lambda x: x[1])),
    )  # fmt: skip


def settled_bytes(read: Callable[[int, int], bytes], size: int = hdr.MAX_HEADER_SIZE) -> bytes:
    """The first `size` bytes of the header region, read again while a membership rewrite may be
    half-way (it lasts microseconds; a torn read fails the crc or a length check). Returns the last
    read whatever it holds: a header never written (no magic) is not waited for."""
    for attempt in range(READ_TRIES):
        data = read(0, size)
        if data[: len(hdr.MAGIC)] != hdr.MAGIC or attempt == READ_TRIES - 1:
            return data
        try:
            PoolHeader.unpack(data)
            return data
        except InputError:
            time.sleep(READ_PAUSE_S)
    raise AssertionError("unreachable")


def read_header(read: Callable[[int, int], bytes]) -> PoolHeader:
    """Unpack the header through `read(offset, n)` once it has settled (`settled_bytes`). A record that
    stays unreadable is raised, saying so when a staged rewrite is waiting to be finished (`recover`)."""
    data = settled_bytes(read)
    try:
        return PoolHeader.unpack(data)
    except InputError as exc:
        if data[: len(hdr.MAGIC)] != hdr.MAGIC or staged(read) is None:
            raise
        raise InputError(
            f"{exc.what}: a membership rewrite was interrupted",
            why="the new record is staged in the header region; the one at offset 0 is half-written",
            fix="`belugactl setup -f MANIFEST` on one host finishes it (`belugactl pool members POOL -f "
            "MANIFEST` for a pool file); nothing is lost",
            where=exc.where,
        ) from None


def staged(read: Callable[[int, int], bytes]) -> PoolHeader | None:
    """The record a membership rewrite staged before writing in place, or None (none, or torn)."""
    data = read(STAGE_OFFSET, hdr.MAX_HEADER_SIZE)
    if data[: len(hdr.MAGIC)] != hdr.MAGIC:
        return None
    try:
        return PoolHeader.unpack(data)
    except InputError:
        return None


def recover(window: object) -> PoolHeader | None:
    """Finish a membership rewrite a crash interrupted: the record at offset 0 unreadable and a staged
    one of the same pool waiting. Returns the header as it is now, or None when there was nothing to do."""
    read = window.read  # type: ignore[attr-defined]
    try:
        read_header(read)
        return None
    except InputError:
        pass
    new = staged(read)
    if new is None:
        return None
    data = new.pack()
    _write_in_place(window, data, len(data))
    window.zero(STAGE_OFFSET, hdr.MAX_HEADER_SIZE)  # type: ignore[attr-defined]
    return read_header(read)


def _write_in_place(window: object, data: bytes, old_length: int) -> None:
    """The host table and the membership words first, the identity part (length, count, crc) last;
    never the magic, the claim line or the epoch line."""
    window.write(hdr.MEMBERS_OFFSET, data[hdr.MEMBERS_OFFSET :])  # type: ignore[attr-defined]
    if old_length > len(data):
        window.zero(len(data), old_length - len(data))  # type: ignore[attr-defined]
    window.write(len(hdr.MAGIC), data[len(hdr.MAGIC) : hdr.CLAIM_OFFSET])  # type: ignore[attr-defined]


def record(window: object, ours: PoolHeader, expect: PoolHeader, layout: PoolLayout) -> PoolHeader:
    """Rewrite the pool's host table to `ours`' in place, if the pool still holds `expect`'s
    membership (what the plan showed); bump the version, stamp the epoch. Returns the new header.
    The new record is staged first (`STAGE_OFFSET`), so a crash half-way is finished by `recover`.

    `window` is a PoolMapping (or its window) over the header region; `layout` is `ours`' layout."""
    read = window.read  # type: ignore[attr-defined]
    current = read_header(read)
    migrate = migratable(ours, current, layout)
    if not same_geometry(ours, current) and not migrate:
        raise StepFailed(
            "the pool header changed while setup ran: it is no longer this manifest's geometry",
            fix="rerun `belugactl setup --dry-run` to see the pool as it is now",
        )
    if current.hosts == ours.hosts and not migrate:
        return current  # another host recorded the same membership first
    if (current.members_version != expect.members_version or current.hosts != expect.hosts
            or current.format_version != expect.format_version):
        raise StepFailed(
            f"the pool's membership changed while setup ran (version {expect.members_version} when planned, "
            f"{current.members_version} now)",
            why="another host recorded a membership of its own meanwhile",
            fix="make sure every host has the same manifest, then rerun `belugactl setup --dry-run`",
        )
    epoch = window.load_u64(hdr.EPOCH_OFFSET)  # type: ignore[attr-defined]
    new = replace(current, format_version=ours.format_version, layout_hash=ours.layout_hash, hosts=ours.hosts,
                  members_version=current.members_version + 1, members_epoch=epoch)  # fmt: skip
    data = new.pack()
    window.write(STAGE_OFFSET, data)  # type: ignore[attr-defined]
    _write_in_place(window, data, current.length)
    window.zero(STAGE_OFFSET, hdr.MAX_HEADER_SIZE)  # type: ignore[attr-defined]
    written = read_header(read)
    if written != replace(new, epoch=written.epoch, claim=written.claim):
        raise StepFailed(
            "the pool's membership did not read back as written",
            why="another host wrote the header at the same time",
            fix="stop setup on the other hosts, then rerun `belugactl setup` on one host",
        )
    return written
