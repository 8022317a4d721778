"""The pool layout: every offset in the shared pool, derived from the manifest alone.

Offsets are the contract between hosts: two hosts that resolve the same manifest get the same
layout and the same `layout_hash`, which is written into the on-media header and checked by
every host before it uses the pool. Nothing here reads a machine.

    [ header ][ metadata: RPC rings | journal ][ shared KV ][ host 0 ] ... [ host N-1 ][ unused ]

Every boundary is a multiple of the devdax align (2 MiB by default).

With a memory-type split (caching.memory_types: seeds, or areas with the KV area uncachable and
the control areas write-back) the host partitions come first and the shared KV area is placed and
sized so that a few variable MTRRs (caching.kv_mtrrs) cover it exactly, as pool offsets:

    [ header ][ metadata ][ host 0 ] ... [ host N-1 ][ unused: kv-align ][ shared KV ][ unused ]

Without a split nothing of this applies and the layout (and its hash) is what it always was.

With layout.capacity (format 2) the pool is laid out for a fixed number of host slots and CXL-RPC
rings per slot, whoever uses them: a host's partition is its slot's, its processes take the rings
`slot * rings_per_host` onwards, and the layout hash covers only this geometry. Who sits in which
slot (the membership) is the header's host table, rewritten in place by setup when hosts or
processes change (pool/membership.py): no region moves, so no cached block is dropped.

CXL-RPC rings: a ring has exactly one client, and every vLLM process holds a client of its own (a
connector object each: the scheduler's, and one per tensor-parallel worker), so the layout allots
one ring per process: for each instance on each worker host, `scheduler`, then `worker0` ..
`worker{N-1}` (N = `workers_per_instance`), then `spare_rings` for tools and probes. Rings are
allotted whatever transport serve later picks for a host (serve.metadata.transport), so switching a
host between CXL-RPC and TCP never changes the layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from belugactl.errors import InputError
from belugactl.model.manifest_schema import Host, Manifest
from belugactl.units import align_down, align_up, format_size

# Bumped whenever the meaning of any offset changes; part of the layout hash and the header.
FORMAT_VERSION = 1
# The capacity layout (layout.capacity): fixed slots and rings, membership outside the hash.
CAPACITY_FORMAT_VERSION = 2
# RPC rings start on page boundaries so one client's ring never shares a page with another's.
RING_ALIGN = 4096


class LayoutDoesNotFit(InputError):
    """The manifest's sizes do not fit the pool; `path` names the field to change."""

    def __init__(self, path: tuple[str | int, ...], message: str, hint: str | None = None) -> None:
        super().__init__(message, fix=hint)
        self.path = path
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Extent:
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class RpcArea:
    """CXL-RPC slot rings: one ring per client (a vLLM process), then spare rings.

    Offsets of single rings and slots are the pool geometry's (belugactl/pool/geometry.py), which
    checks their bounds; this is the layout's derivation of the area, and nothing more."""

    offset: int
    ring_count: int
    slots_per_ring: int
    slot_size: int
    ring_stride: int

    @property
    def size(self) -> int:
        return self.ring_count * self.ring_stride


# The first 4 KiB of every host partition belong to belugactl (the rack probe record lives in its
# first cache line); data users start at `Partition.data_offset`.
PARTITION_LABEL_SIZE = 4096


@dataclass(frozen=True)
class Partition:
    host: str
    index: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def data_offset(self) -> int:
        return self.offset + PARTITION_LABEL_SIZE

    @property
    def data_size(self) -> int:
        return self.size - PARTITION_LABEL_SIZE


SCHEDULER = "scheduler"


def worker_process(rank: int) -> str:
    """The process name of a tensor-parallel worker: worker0, worker1, ..."""
    return f"worker{rank}"


def workers_per_instance(manifest: Manifest, host: Host) -> int:
    """Worker processes (tensor-parallel ranks) one vLLM instance runs on `host`, as serve launches it:
    `serve.vllm.gpus_per_instance` on a GPU host (serve passes it as --tensor-parallel-size), one on a
    CPU host (serve passes no tensor parallelism there)."""
    if host.platform != "gpu" or manifest.serve is None:
        return 1
    return max(1, manifest.serve.vllm.gpus_per_instance)


def instance_processes(manifest: Manifest, host: Host) -> list[str]:
    """The CXL-RPC clients of one instance on `host`: the scheduler, then each worker."""
    return [SCHEDULER, *(worker_process(r) for r in range(workers_per_instance(manifest, host)))]


@dataclass(frozen=True)
class Client:
    """One CXL-RPC client: a process (`scheduler`, `worker0`, ...) of a vLLM instance on a host, and
    the ring it owns. `process` is None only in the layout of belugactl before per-process rings
    (one ring per instance), which `legacy_layout_hash` rebuilds to recognise such a pool."""

    host: str
    instance: int
    ring: int
    process: str | None = SCHEDULER

    @property
    def owner(self) -> str:
        """host/vllm-N/process: how pool show and pool inspect name a ring's owner."""
        return f"{self.host}/vllm-{self.instance}" + (f"/{self.process}" if self.process else "")


@dataclass(frozen=True)
class Region:
    """One row of the pool map, for display: contiguous rows cover the whole pool."""

    name: str
    kind: str  # header | rpc | journal | shared-kv | partition | unused
    offset: int
    size: int
    owner: str  # a host name, "metadata server", "all hosts", or "-"
    detail: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class PoolLayout:
    pool_size: int
    align: int
    header: Extent
    metadata: Extent
    rpc: RpcArea
    journal: Extent
    shared_kv: Extent
    partitions: tuple[Partition, ...]
    clients: tuple[Client, ...]
    format_version: int = FORMAT_VERSION
    # layout.capacity: (host slots, rings per slot), and every slot's extent, free ones too.
    capacity: tuple[int, int] | None = None
    slots: tuple[Extent, ...] = ()
    # With a split: {"kv": "uncachable", "control": "write-back"}; None: one type for the whole pool
    # (caching.pool_memory_type), which is not the layout's business.
    memory_types: tuple[tuple[str, str], ...] | None = None
    _by_host: dict[str, Partition] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_host.update({p.host: p for p in self.partitions})

    @property
    def used(self) -> int:
        parts = self.slots or self.partitions
        if self.split:  # the areas' bytes: the gap that aligns the KV area is unused
            return self.metadata.end + self.shared_kv.size + sum(p.size for p in parts)
        return parts[-1].end if parts else self.shared_kv.end

    @property
    def split(self) -> bool:
        """The KV area has a memory type of its own (uncachable) and its own MTRR pieces."""
        return self.memory_types is not None

    def area_type(self, area: str) -> str | None:
        """"kv" or "control": its memory type with a split, None without one."""
        return dict(self.memory_types)[area] if self.memory_types is not None else None

    @property
    def kv_pieces(self) -> list[tuple[int, int]]:
        """The shared KV area as (pool offset, size) pieces, each a power of two aligned to itself:
        one variable MTRR each on a host whose physical base is aligned to the largest piece."""
        return mtrr_pieces(self.shared_kv.offset, self.shared_kv.size)

    @property
    def uncachable_spans(self) -> tuple[tuple[int, int], ...] | None:
        """Pool offsets (offset, size) setup marks uncachable with a split: the shared KV area; None
        without one (then caching.pool_memory_type says it for the whole pool)."""
        return ((self.shared_kv.offset, self.shared_kv.size),) if self.split else None

    @property
    def control_extents(self) -> list[Extent]:
        """What the CPU polls or writes small: the header, the RPC rings and the journal."""
        return [self.header, self.metadata]

    @property
    def unused(self) -> int:
        return self.pool_size - self.used

    def partition_for(self, host: str) -> Partition:
        try:
            return self._by_host[host]
        except KeyError:
            raise KeyError(f"no partition for host {host!r}; hosts: {', '.join(self._by_host)}") from None

    def ring_for(self, host: str, instance: int, process: str = SCHEDULER) -> int:
        for client in self.clients:
            if client.host == host and client.instance == instance and client.process == process:
                return client.ring
        raise KeyError(f"no CXL-RPC ring for {host!r} instance {instance} process {process!r}")

    def rings_of(self, host: str, instance: int) -> dict[str, int]:
        """process name -> ring, for one instance (empty when the layout has none for it)."""
        return {c.process or SCHEDULER: c.ring for c in self.clients if c.host == host and c.instance == instance}

    @property
    def spare_rings(self) -> range:
        if self.capacity is not None:
            return range(self.capacity[0] * self.capacity[1], self.rpc.ring_count)
        return range(len(self.clients), self.rpc.ring_count)

    def canonical(self) -> dict[str, Any]:
        """Everything that two hosts must agree on, and nothing else (no names of display rows)."""
        if self.capacity is not None:
            # The geometry only: who uses which slot and ring is the membership, not the layout.
            return {
                **self._regions_canonical(),
                "capacity": list(self.capacity),
                "slots": [[e.offset, e.size] for e in self.slots],
                **self._types_canonical(),
            }
        return {
            **self._regions_canonical(),
            "partitions": [[p.host, p.index, p.offset, p.size] for p in self.partitions],
            "clients": [
                [c.host, c.instance, c.ring] if c.process is None else [c.host, c.instance, c.process, c.ring]
                for c in self.clients
            ],
            **self._types_canonical(),
        }

    def _regions_canonical(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "pool_size": self.pool_size,
            "align": self.align,
            "header": [self.header.offset, self.header.size],
            "metadata": [self.metadata.offset, self.metadata.size],
            "rpc": [
                self.rpc.offset,
                self.rpc.ring_count,
                self.rpc.slots_per_ring,
                self.rpc.slot_size,
                self.rpc.ring_stride,
            ],
            "journal": [self.journal.offset, self.journal.size],
            "shared_kv": [self.shared_kv.offset, self.shared_kv.size],
        }

    def _types_canonical(self) -> dict[str, Any]:
        # Only with a split, so a layout without one hashes as it always did.
        return {"memory_types": dict(self.memory_types)} if self.memory_types is not None else {}

    def partition_rows(self, detail: str = "") -> Iterator[Region]:
        """A row per partition, and with a capacity a row per free slot too, in pool order."""
        if self.capacity is None:
            for p in self.partitions:
                yield Region(f"partition:{p.host}", "partition", p.offset, p.size, p.host,
                             f"host {p.index}{detail}")
            return
        by_slot = {p.index: p for p in self.partitions}
        for i, e in enumerate(self.slots):
            p = by_slot.get(i)
            if p is None:
                yield Region(f"slot:{i}", "partition", e.offset, e.size, "-", f"slot {i}, free{detail}")
            else:
                yield Region(f"partition:{p.host}", "partition", p.offset, p.size, p.host, f"slot {i}{detail}")

    @cached_property
    def layout_hash(self) -> str:
        """sha256 (hex) of the canonical JSON: the contract between hosts, written into the header."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def regions(self) -> Iterator[Region]:
        if self.split:
            yield from self._split_regions()
            return
        rpc_area = Extent(self.rpc.offset, self.journal.offset - self.rpc.offset)
        yield Region(
            "header", "header", self.header.offset, self.header.size, "all hosts", "magic, uuid, layout hash, epoch"
        )
        yield Region(
            "rpc-rings",
            "rpc",
            rpc_area.offset,
            rpc_area.size,
            "metadata server",
            self._rings_detail(),
        )
        yield Region("journal", "journal", self.journal.offset, self.journal.size, "metadata server", "index journal")
        yield Region("shared-kv", "shared-kv", self.shared_kv.offset, self.shared_kv.size, "all hosts", "KV blocks")
        yield from self.partition_rows()
        if self.unused:
            yield Region("unused", "unused", self.used, self.unused, "-", "alignment tail")

    def _rings_detail(self) -> str:
        room = (f" ({self.capacity[1]} per host slot)" if self.capacity is not None else "")
        return (
            f"{self.rpc.ring_count}x{self.rpc.slots_per_ring} slots of {self.rpc.slot_size} B: "
            f"{len(self.clients)} vLLM processes{room}, {len(self.spare_rings)} spare"
        )

    def _split_regions(self) -> Iterator[Region]:
        """The rows of a split layout, each saying its memory type; gaps are unused rows."""
        control = self.area_type("control")
        kv = self.area_type("kv")
        cpu = f"{control}: flushes, non-temporal stores"
        rpc_area = Extent(self.rpc.offset, self.journal.offset - self.rpc.offset)
        pieces = self.kv_pieces
        rows = [
            Region("header", "header", self.header.offset, self.header.size, "all hosts",
                   f"magic, uuid, layout hash, epoch; {cpu}"),
            Region("rpc-rings", "rpc", rpc_area.offset, rpc_area.size, "metadata server",
                   f"{self._rings_detail()}; {cpu}"),
            Region("journal", "journal", self.journal.offset, self.journal.size, "metadata server",
                   f"index journal; {cpu}"),
            *self.partition_rows(f"; {control}"),
            Region("shared-kv", "shared-kv", self.shared_kv.offset, self.shared_kv.size, "all hosts",
                   f"KV blocks; {kv}: {len(pieces)} MTRR piece(s) "
                   + ", ".join(f"{format_size(s)}@{o:#x}" for o, s in pieces)),
        ]
        cursor = 0
        for row in sorted(rows, key=lambda r: r.offset):
            if row.offset > cursor:
                why = "below the KV area: aligns it for its MTRRs" if row.kind == "shared-kv" else "alignment gap"
                yield Region("kv-align" if row.kind == "shared-kv" else "unused", "unused", cursor,
                             row.offset - cursor, "-", f"{why}; {control}")
            yield row
            cursor = row.end
        if cursor < self.pool_size:
            yield Region("unused", "unused", cursor, self.pool_size - cursor, "-", f"alignment tail; {control}")

    def to_dict(self) -> dict[str, Any]:
        data = self.canonical()
        data["layout_hash"] = self.layout_hash
        data["rpc"] = {
            "offset": self.rpc.offset,
            "size": self.rpc.size,
            "ring_count": self.rpc.ring_count,
            "slots_per_ring": self.rpc.slots_per_ring,
            "slot_size": self.rpc.slot_size,
            "ring_stride": self.rpc.ring_stride,
        }
        for key in ("header", "metadata", "journal", "shared_kv"):
            extent: Extent = getattr(self, key)
            data[key] = {"offset": extent.offset, "size": extent.size}
        data["partitions"] = [
            {"host": p.host, "index": p.index, "offset": p.offset, "size": p.size} for p in self.partitions
        ]
        data["clients"] = [
            {"host": c.host, "instance": c.instance, "process": c.process, "ring": c.ring} for c in self.clients
        ]
        data["spare_rings"] = list(self.spare_rings)
        if self.capacity is not None:
            data["capacity"] = {"hosts": self.capacity[0], "rings_per_host": self.capacity[1]}
            data["slots"] = [{"slot": i, "offset": e.offset, "size": e.size} for i, e in enumerate(self.slots)]
        data["unused"] = self.unused
        if self.memory_types is not None:
            data["kv_mtrr_pieces"] = [{"offset": o, "size": s} for o, s in self.kv_pieces]
        data["regions"] = [
            {
                "name": r.name,
                "kind": r.kind,
                "offset": r.offset,
                "end": r.end,
                "size": r.size,
                "owner": r.owner,
                "detail": r.detail,
            }
            for r in self.regions()
        ]
        return data


def _clients(manifest: Manifest, *, per_process: bool) -> list[Client]:
    clients: list[Client] = []
    for host in manifest.hosts:
        for instance in range(manifest.instances_on(host)):
            if not per_process:
                clients.append(Client(host.name, instance, len(clients), None))
                continue
            for process in instance_processes(manifest, host):
                clients.append(Client(host.name, instance, len(clients), process))
    return clients


def _capacity_clients(manifest: Manifest, rings_per_host: int) -> list[Client]:
    """With a capacity: a host's processes take the rings of its slot, in the same order as above."""
    clients: list[Client] = []
    for host in manifest.hosts:
        ring = manifest.slot_of(host) * rings_per_host
        for instance in range(manifest.instances_on(host)):
            for process in instance_processes(manifest, host):
                clients.append(Client(host.name, instance, ring, process))
                ring += 1
    return clients


def resolve_layout(manifest: Manifest) -> PoolLayout:
    """Derive the layout; raise LayoutDoesNotFit (an InputError) naming the field to change."""
    cap = manifest.layout.capacity
    if cap is not None:
        return _resolve(manifest, _capacity_clients(manifest, cap.rings_per_host))
    return _resolve(manifest, _clients(manifest, per_process=True))


def legacy_layout(manifest: Manifest) -> PoolLayout | None:
    """The layout belugactl derived from this manifest before rings were allotted per process (one
    ring per vLLM instance), or None when that layout does not fit. Only to recognise such a pool and
    say so (and for tests to write one): nothing serves on that layout any more."""
    try:
        return _resolve(manifest, _clients(manifest, per_process=False))
    except LayoutDoesNotFit:
        return None


def legacy_layout_hash(manifest: Manifest) -> str | None:
    old = legacy_layout(manifest)
    return old.layout_hash if old is not None else None


def stale_layout_note(
    manifest: Manifest, layout: PoolLayout, pool_hash: str, pool_rings: int, *, same_pool: bool = True
) -> str | None:
    """Why a pool header's layout differs from this manifest's, when it is about the CXL-RPC rings:
    written by a belugactl that allotted one ring per instance, or (`same_pool`: the header's pool
    uuid is this manifest's) for fewer rings than this manifest's processes need. None otherwise
    (then the field diff is the explanation)."""
    if pool_hash == layout.layout_hash:
        return None
    need = f"{layout.rpc.ring_count} ({len(layout.clients)} vLLM processes + {len(layout.spare_rings)} spare)"
    if pool_hash == legacy_layout_hash(manifest):
        return (
            f"the pool layout changed: this pool's header was written by an older belugactl, which gave each vLLM "
            f"instance one CXL-RPC ring ({pool_rings} rings); this one gives every vLLM process its own ring "
            f"(the scheduler and each tensor-parallel worker): {need}, so the metadata area, the journal, the "
            f"shared KV area and the host partitions start at other offsets"
        )
    if same_pool and pool_rings < layout.rpc.ring_count:
        return (
            f"the pool has {pool_rings} CXL-RPC rings, fewer than this manifest's processes need: {need}; it was "
            f"set up for fewer instances or tensor-parallel workers"
        )
    return None


def _resolve(manifest: Manifest, clients: list[Client]) -> PoolLayout:
    pool_size = manifest.pool.size
    align = manifest.pool.align
    lay = manifest.layout
    md = lay.metadata

    header = Extent(0, lay.header)
    cap = lay.capacity
    ring_count = (cap.hosts * cap.rings_per_host if cap is not None else len(clients)) + md.spare_rings
    ring_stride = align_up(md.slots_per_ring * md.slot_size, RING_ALIGN)
    rpc = RpcArea(header.end, ring_count, md.slots_per_ring, md.slot_size, ring_stride)
    journal = Extent(align_up(rpc.offset + rpc.size, align), md.journal)
    metadata = Extent(rpc.offset, journal.end - rpc.offset)

    # Partition sizes: a host's own size, else the layout's size, else an equal split (below).
    fixed_sizes: list[int | None] = []
    # With a capacity every slot is sized (manifest_rules keeps per-host sizes and "equal" out).
    sized: list[Host | None] = list(manifest.hosts) if cap is None else [None] * cap.hosts
    for host in sized:
        if host is not None and host.partition_size is not None:
            fixed_sizes.append(host.partition_size)
        elif isinstance(lay.partition_size, int):
            fixed_sizes.append(lay.partition_size)
        elif lay.partition_size is None:
            fixed_sizes.append(align)  # the default: room for belugactl's per-host records only
        else:
            fixed_sizes.append(None)
    fixed_total = sum(s for s in fixed_sizes if s is not None)
    equal_count = sum(1 for s in fixed_sizes if s is None)
    after_metadata = pool_size - metadata.end

    def breakdown() -> str:
        return (
            f"header {format_size(header.size)} + metadata {format_size(metadata.size)}"
            f" ({ring_count} RPC rings, journal {format_size(journal.size)})"
        )

    if after_metadata < 0:
        raise LayoutDoesNotFit(
            ("pool", "size"),
            f"the pool ({format_size(pool_size)}) is smaller than {breakdown()}",
            "shrink layout.metadata (journal, slots_per_ring, slot_size) or use a larger pool",
        )

    if isinstance(lay.shared_kv, int) or lay.shared_kv.endswith("%"):
        if isinstance(lay.shared_kv, int):
            shared_size = lay.shared_kv
        else:
            shared_size = align_down(after_metadata * int(lay.shared_kv[:-1]) // 100, align)
        remaining = after_metadata - shared_size - fixed_total
        if remaining < 0:
            raise LayoutDoesNotFit(
                ("layout", "shared_kv"),
                f"the layout needs {format_size(pool_size - remaining)} but the pool holds {format_size(pool_size)}: "
                f"{breakdown()} + shared KV {format_size(shared_size)} + partitions {format_size(fixed_total)}",
                f"shrink shared_kv or the partitions by {format_size(-remaining)}",
            )
        if equal_count:
            each = align_down(remaining // equal_count, align)
            if each < align:
                raise LayoutDoesNotFit(
                    ("layout", "partition_size"),
                    f"an equal split leaves {format_size(each)} per host, less than one {format_size(align)} page: "
                    f"{format_size(remaining)} remains for {equal_count} hosts",
                    "shrink shared_kv or give hosts explicit partition sizes",
                )
            sizes = [s if s is not None else each for s in fixed_sizes]
        else:
            sizes = [s for s in fixed_sizes if s is not None]
    else:
        # shared_kv: rest (the rules guarantee every partition has a size here)
        sizes = [s if s is not None else 0 for s in fixed_sizes]
        shared_size = align_down(after_metadata - sum(sizes), align)
        if shared_size < align:
            raise LayoutDoesNotFit(
                ("layout", "shared_kv") if shared_size >= 0 else ("layout", "partition_size"),
                f"the partitions ({format_size(sum(sizes))}) leave {format_size(max(shared_size, 0))} for the shared "
                f"KV area after {breakdown()} in a {format_size(pool_size)} pool",
                "shrink the partitions",
            )

    if manifest.caching.split:
        return _split_layout(manifest, clients, header, metadata, rpc, journal, sizes, shared_size)
    shared_kv = Extent(metadata.end, shared_size)
    partitions, slots, _ = _place_partitions(manifest, sizes, shared_kv.end)
    return PoolLayout(
        pool_size=pool_size,
        align=align,
        header=header,
        metadata=metadata,
        rpc=rpc,
        journal=journal,
        shared_kv=shared_kv,
        partitions=partitions,
        clients=tuple(clients),
        **_capacity_fields(manifest, slots),
    )


def _place_partitions(
    manifest: Manifest, sizes: list[int], offset: int
) -> tuple[tuple[Partition, ...], tuple[Extent, ...], int]:
    """Lay the partitions (a capacity's slots) end to end from `offset`: the hosts' partitions, every
    slot's extent (capacity only, else empty) and the end."""
    cap = manifest.layout.capacity
    extents: list[Extent] = []
    for size in sizes:
        extents.append(Extent(offset, size))
        offset += size
    if cap is None:
        parts = [Partition(h.name, i, e.offset, e.size) for i, (h, e) in enumerate(zip(manifest.hosts, extents,
                                                                                         strict=True))]
        return tuple(parts), (), offset
    parts = sorted((Partition(h.name, s, extents[s].offset, extents[s].size)
                    for h in manifest.hosts if (s := manifest.slot_of(h)) < len(extents)), key=lambda p: p.index)
    return tuple(parts), tuple(extents), offset


def _capacity_fields(manifest: Manifest, slots: tuple[Extent, ...]) -> dict[str, Any]:
    cap = manifest.layout.capacity
    if cap is None:
        return {}
    return {"capacity": (cap.hosts, cap.rings_per_host), "slots": slots, "format_version": CAPACITY_FORMAT_VERSION}


def split_geometry(shared_kv_offset: int, partition_offsets: list[int]) -> bool:
    """Whether offsets (a header's) are a memory-type split's layout: only a split puts the host
    partitions before the shared KV area (`_split_layout`); every other layout puts them after it.
    Setup reads the split from the header it writes this way (workflows/setup/topics/mtrr.py)."""
    return bool(partition_offsets) and min(partition_offsets) < shared_kv_offset


def mtrr_pieces(offset: int, size: int) -> list[tuple[int, int]]:
    """[offset, offset+size) as the fewest pieces each a power of two in size and aligned to it,
    greedy from the low end (offset 0 counts as aligned to anything)."""
    pieces = []
    while size > 0:
        align = offset & -offset if offset else 1 << 62
        piece = min(align, 1 << (size.bit_length() - 1))
        pieces.append((offset, piece))
        offset += piece
        size -= piece
    return pieces


def _split_layout(
    manifest: Manifest,
    clients: list[Client],
    header: Extent,
    metadata: Extent,
    rpc: RpcArea,
    journal: Extent,
    sizes: list[int],
    shared_size: int,
) -> PoolLayout:
    """The layout of a memory-type split: partitions right after the metadata, then the shared KV
    area on a granule G (a power of two, at least the align) that lets at most caching.kv_mtrrs
    MTRR pieces cover it. An explicit shared_kv size is kept exactly (placed where it takes the
    fewest pieces); a derived one (rest, a percentage) is rounded inward to G, the smallest G that fits."""
    pool_size = manifest.pool.size
    align = manifest.pool.align
    budget = manifest.caching.kv_mtrrs
    partitions, slots, low = _place_partitions(manifest, sizes, metadata.end)
    # the KV area starts at or after the partitions
    explicit = isinstance(manifest.layout.shared_kv, int)
    best: tuple[int, int, int] | None = None  # (pieces, offset, size)
    granule = align
    while granule <= max(pool_size, align):
        start = align_up(low, granule)
        end = start + shared_size if explicit else align_down(min(start + shared_size, pool_size), granule)
        if start < end <= pool_size:
            count = len(mtrr_pieces(start, end - start))
            if explicit:
                if best is None or count < best[0]:
                    best = (count, start, end - start)
            elif count <= budget:
                best = (count, start, end - start)
                break
        granule <<= 1
    if best is None or best[0] > budget:
        if explicit:
            needs = f"at best {best[0]} MTRR pieces" if best else "more room than the pool has"
            raise LayoutDoesNotFit(
                ("layout", "shared_kv"),
                f"a shared KV area of exactly {format_size(shared_size)} with its own memory type needs {needs}; "
                f"caching.kv_mtrrs allows {budget}",
                "make shared_kv a sum of few powers of two (e.g. 48 GiB = 32 + 16) or rest, or raise caching.kv_mtrrs",
            )
        raise LayoutDoesNotFit(
            ("pool", "size"),
            f"no granule lets {budget} MTRR piece(s) cover a shared KV area in a {format_size(pool_size)} pool "
            f"after {format_size(low)} of header, metadata and partitions",
            "use a larger pool (a power of two is covered by the fewest pieces) or raise caching.kv_mtrrs",
        )
    _, kv_offset, kv_size = best
    kinds = manifest.caching.area_types()
    return PoolLayout(
        pool_size=pool_size,
        align=align,
        header=header,
        metadata=metadata,
        rpc=rpc,
        journal=journal,
        shared_kv=Extent(kv_offset, kv_size),
        partitions=partitions,
        clients=tuple(clients),
        memory_types=(("kv", kinds["kv"]), ("control", kinds["control"])),
        **_capacity_fields(manifest, slots),
    )


@dataclass(frozen=True)
class Stripes:
    """Software interleave: `ways` equal devices laid end to end, striped in `granularity` units.

    An allocation policy for the shared KV area (the metadata server spreads a large extent over
    devices), not part of the layout contract: clients address extents by pool offset either way.
    """

    ways: int
    granularity: int
    device_size: int

    def device_of(self, offset: int) -> int:
        return offset // self.device_size

    def stripe_start(self, offset: int) -> int:
        return align_down(offset, self.granularity)


def software_stripes(manifest: Manifest) -> Stripes | None:
    """The software interleave the manifest asks for, or None (hardware or no interleave)."""
    il = manifest.pool.interleave
    if il.mode != "software":
        return None
    granularity = il.granularity if il.granularity is not None else manifest.pool.align
    return Stripes(il.ways, granularity, manifest.pool.size // il.ways)
