"""The on-media pool header at offset 0: a fixed little-endian record every host verifies.

The record carries the pool's geometry (pool/geometry.py: pool size, RPC rings, journal, shared KV
area) as one `PoolGeometry`, built from the layout when the header is made and checked again when
it is read back.

Bytes read from shared memory are untrusted (another host, an older version, a crash mid-write,
or plain garbage): `PoolHeader.unpack` checks every length, offset and the crc, and raises
`InputError` for anything wrong, never a struct or unicode exception.

Byte layout (all integers little-endian; docs/pool-format.md has the same table):

    0    8  magic b"BELUGAPL"           written last by the initializing host
    8    4  format version (u32)
    12   4  header length (u32)         384 + 64 * host count
    16   4  crc32 (u32)                 over [0, header length) with crc, claim and epoch lines zeroed
    20   4  host count (u32)            1..16
    24  16  pool uuid (16 raw bytes)
    40  32  layout hash (sha256, raw)
    72   8  pool size (u64)
    80   8  devdax align (u64)
    88   8  created time (u64, unix seconds)
    96  48  created by (UTF-8 host name, NUL padded)
    144  8  rpc offset (u64)
    152  8  rpc ring stride (u64)
    160  4  rpc ring count (u32)
    164  4  rpc slots per ring (u32)
    168  4  rpc slot size (u32)
    172  4  reserved, zero
    176  8  journal offset (u64)
    184  8  journal size (u64)
    192  8  CLAIM word (u64)             alone in its cache line (192..255), set by compare-and-swap
    256  8  EPOCH (u64)                 alone in its cache line (256..319), bumped by each metadata-server start
    320  8  shared KV offset (u64)
    328  8  shared KV size (u64)
    336  8  membership version (u64)    format 2 only (layout.capacity), else zero: bumped by each rewrite
    344  8  membership epoch (u64)      format 2 only: the EPOCH when the membership was last written
    352 32  reserved, zero
    384 64*N host table: name (48 bytes, UTF-8, NUL padded), partition offset (u64), partition size (u64)

Format 2 (a layout with a capacity, model/layout.py) has the same record; its layout hash covers the
geometry only, and its host table (who sits in which partition slot) is the rack's membership, which
setup rewrites in place when hosts change (pool/membership.py). Format 1's hash covers the hosts too.

Outside the record, still in the header region: the rings' doorbells, a byte per ring from
DOORBELL_OFFSET (1 MiB; pool/geometry.py), bumped by clients, read by the server, never in the crc.
"""

from __future__ import annotations

import os
import struct
import time
import uuid as uuid_mod
import zlib
from dataclasses import dataclass
from typing import Any

from belugactl.errors import InputError, PoolMismatch
from belugactl.model.layout import CAPACITY_FORMAT_VERSION, FORMAT_VERSION, PoolLayout
from belugactl.model.manifest_schema import HOST_NAME_MAX, MAX_HOSTS, Manifest
from belugactl.pool import geometry as geometry_mod
from belugactl.pool.geometry import PoolGeometry
from belugactl.units import format_size

MAGIC = b"BELUGAPL"
MAGIC_OFFSET = 0
CRC_OFFSET = 16
CLAIM_OFFSET = 192  # 8-byte aligned, own cache line: the first writer's compare-and-swap target
EPOCH_OFFSET = 256  # 8-byte aligned, own cache line: the data plane bumps it atomically
FIXED_SIZE = 384
HOST_ENTRY_SIZE = 64
NAME_FIELD = HOST_NAME_MAX + 1  # 48
MAX_HEADER_SIZE = FIXED_SIZE + HOST_ENTRY_SIZE * MAX_HOSTS
HEADER_REGION = geometry_mod.HEADER_REGION  # the region the layout reserves; the record itself is far smaller
DOORBELL_OFFSET = geometry_mod.DOORBELL_OFFSET  # the rings' doorbells, in the region's second MiB
# Byte ranges that change after the header is written, so the crc leaves them out.
_LIVE_RANGES = ((CLAIM_OFFSET, CLAIM_OFFSET + 64), (EPOCH_OFFSET, EPOCH_OFFSET + 64))

_IDENTITY = struct.Struct("<8sIIII16s32sQQQ48sQQIIIIQQ")  # bytes 0..192
_SHARED = struct.Struct("<QQ")  # bytes 320..336
_MEMBERS = struct.Struct("<QQ")  # bytes 336..352: membership version and epoch (format 2)
MEMBERS_OFFSET = 336
READABLE_VERSIONS = (FORMAT_VERSION, CAPACITY_FORMAT_VERSION)
_ENTRY = struct.Struct(f"<{NAME_FIELD}sQQ")
_U64 = struct.Struct("<Q")
assert _IDENTITY.size == CLAIM_OFFSET and _ENTRY.size == HOST_ENTRY_SIZE


@dataclass(frozen=True)
class HostEntry:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class PoolHeader:
    format_version: int
    pool_uuid: str
    layout_hash: str  # hex
    align: int
    created_time: int
    created_by: str
    geometry: PoolGeometry  # pool size, RPC rings, journal, shared KV area
    hosts: tuple[HostEntry, ...]
    epoch: int = 0
    claim: int = 0
    members_version: int = 0  # format 2: how many times the membership was written
    members_epoch: int = 0  # format 2: the pool epoch at its last write

    # ---- building ------------------------------------------------------------------------
    @classmethod
    def from_layout(
        cls,
        manifest: Manifest,
        layout: PoolLayout,
        *,
        created_by: str,
        created_time: int | None = None,
        epoch: int = 0,
        claim: int = 0,
    ) -> PoolHeader:
        return cls(
            format_version=layout.format_version,
            pool_uuid=pool_uuid(manifest),
            layout_hash=layout.layout_hash,
            align=layout.align,
            created_time=int(time.time()) if created_time is None else created_time,
            created_by=_fit_name(created_by),
            geometry=PoolGeometry.from_layout(layout),
            hosts=tuple(HostEntry(p.host, p.offset, p.size) for p in layout.partitions),
            epoch=epoch,
            claim=claim,
        )

    @property
    def pool_size(self) -> int:
        return self.geometry.pool_size

    @property
    def length(self) -> int:
        return FIXED_SIZE + HOST_ENTRY_SIZE * len(self.hosts)

    # ---- bytes ---------------------------------------------------------------------------
    def pack(self, *, include_magic: bool = True) -> bytes:
        """The record as bytes. With include_magic=False the magic is zero, for a writer that
        stores everything else first and the magic last (see docs/pool-format.md, claim protocol)."""
        if not 1 <= len(self.hosts) <= MAX_HOSTS:
            raise ValueError(f"a header holds 1..{MAX_HOSTS} hosts, not {len(self.hosts)}")
        buf = bytearray(self.length)
        g = self.geometry
        _IDENTITY.pack_into(
            buf,
            0,
            MAGIC,
            self.format_version,
            self.length,
            0,
            len(self.hosts),
            uuid_mod.UUID(self.pool_uuid).bytes,
            bytes.fromhex(self.layout_hash),
            g.pool_size,
            self.align,
            self.created_time,
            _name_bytes(self.created_by, "created_by"),
            g.rpc_offset,
            g.ring_stride,
            g.ring_count,
            g.slots_per_ring,
            g.slot_size,
            0,
            g.journal_offset,
            g.journal_size,
        )
        _U64.pack_into(buf, CLAIM_OFFSET, self.claim)
        _U64.pack_into(buf, EPOCH_OFFSET, self.epoch)
        _SHARED.pack_into(buf, 320, g.shared_kv_offset, g.shared_kv_size)
        _MEMBERS.pack_into(buf, MEMBERS_OFFSET, self.members_version, self.members_epoch)
        for i, host in enumerate(self.hosts):
            _ENTRY.pack_into(
                buf, FIXED_SIZE + i * HOST_ENTRY_SIZE, _name_bytes(host.name, "host"), host.offset, host.size
            )
        struct.pack_into("<I", buf, CRC_OFFSET, _crc(buf))
        if not include_magic:
            buf[MAGIC_OFFSET : MAGIC_OFFSET + len(MAGIC)] = bytes(len(MAGIC))
        return bytes(buf)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> PoolHeader:
        """Parse and verify untrusted bytes (at least the record; the 2 MiB region is fine)."""
        data = bytes(data[:MAX_HEADER_SIZE])
        if len(data) < FIXED_SIZE:
            raise _bad(f"only {len(data)} bytes; the fixed part of a header is {FIXED_SIZE}")
        (
            magic,
            version,
            length,
            crc,
            host_count,
            raw_uuid,
            raw_hash,
            pool_size,
            align,
            created_time,
            raw_created_by,
            rpc_offset,
            ring_stride,
            ring_count,
            slots,
            slot_size,
            reserved,
            journal_offset,
            journal_size,
        ) = _IDENTITY.unpack_from(data, 0)
        if magic != MAGIC:
            if magic == bytes(len(MAGIC)):
                claim = _U64.unpack_from(data, CLAIM_OFFSET)[0]
                if claim:
                    raise _bad(
                        f"no header yet, but claim word {claim:#018x} is set: another host is initializing the pool "
                        "(or crashed while doing so)",
                        fix="wait and retry; if no host is initializing, `belugactl setup --force` resets the claim",
                    )
                raise _bad(
                    "the pool has no header (magic is zero): it was never initialized", fix="run belugactl setup"
                )
            raise _bad(f"bad magic {magic!r}; expected {MAGIC!r}: this is not a belugactl pool, or it is corrupted")
        if version not in READABLE_VERSIONS:
            raise _bad(
                f"header format version {version}; this belugactl reads versions "
                + " and ".join(map(str, READABLE_VERSIONS)),
                fix="use the belugactl release that set up this pool (or a newer one)",
            )
        if not 1 <= host_count <= MAX_HOSTS:
            raise _bad(f"host count {host_count} is outside 1..{MAX_HOSTS}")
        if length != FIXED_SIZE + HOST_ENTRY_SIZE * host_count:
            raise _bad(f"header length {length} does not match {host_count} hosts")
        if length > len(data):
            raise _bad(f"header length {length} but only {len(data)} bytes were read")
        record = bytearray(data[:length])
        if _crc(record) != crc:
            raise _bad(f"crc mismatch (stored {crc:#010x}, computed {_crc(record):#010x}): the header is corrupted")
        members_version, members_epoch = _MEMBERS.unpack_from(record, MEMBERS_OFFSET)
        if version == FORMAT_VERSION and (members_version or members_epoch):
            raise _bad("reserved header bytes are not zero")
        if reserved or any(record[MEMBERS_OFFSET + _MEMBERS.size : FIXED_SIZE]):
            raise _bad("reserved header bytes are not zero")
        shared_offset, shared_size = _SHARED.unpack_from(record, 320)
        hosts = []
        for i in range(host_count):
            raw_name, offset, size = _ENTRY.unpack_from(record, FIXED_SIZE + i * HOST_ENTRY_SIZE)
            name = _name_from(raw_name, f"host entry {i}")
            if offset + size > pool_size:
                raise _bad(f"host entry {i} ({name}) ends at {offset + size}, past the pool size {pool_size}")
            if size and offset < HEADER_REGION:
                where = f"starts at {offset}, inside the first {HEADER_REGION} bytes (the header's)"
                raise _bad(f"host entry {i} ({name}) {where}")
            hosts.append(HostEntry(name, offset, size))
        try:
            geometry = PoolGeometry(
                pool_size=pool_size,
                rpc_offset=rpc_offset,
                ring_count=ring_count,
                slots_per_ring=slots,
                slot_size=slot_size,
                ring_stride=ring_stride,
                journal_offset=journal_offset,
                journal_size=journal_size,
                shared_kv_offset=shared_offset,
                shared_kv_size=shared_size,
            )
        except PoolMismatch as exc:
            raise _bad(exc.what.removeprefix("pool geometry: ")) from None
        return cls(
            format_version=version,
            pool_uuid=str(uuid_mod.UUID(bytes=raw_uuid)),
            layout_hash=raw_hash.hex(),
            align=align,
            created_time=created_time,
            created_by=_name_from(raw_created_by, "created_by"),
            geometry=geometry,
            hosts=tuple(hosts),
            epoch=_U64.unpack_from(record, EPOCH_OFFSET)[0],
            claim=_U64.unpack_from(record, CLAIM_OFFSET)[0],
            members_version=members_version,
            members_epoch=members_epoch,
        )

    def to_dict(self) -> dict[str, Any]:
        """Flat, in the record's order and with the record's field names (stable JSON keys)."""
        g = self.geometry
        return {
            "format_version": self.format_version,
            "pool_uuid": self.pool_uuid,
            "layout_hash": self.layout_hash,
            "pool_size": g.pool_size,
            "align": self.align,
            "created_time": self.created_time,
            "created_by": self.created_by,
            "rpc_offset": g.rpc_offset,
            "rpc_ring_stride": g.ring_stride,
            "rpc_ring_count": g.ring_count,
            "rpc_slots_per_ring": g.slots_per_ring,
            "rpc_slot_size": g.slot_size,
            "journal_offset": g.journal_offset,
            "journal_size": g.journal_size,
            "shared_kv_offset": g.shared_kv_offset,
            "shared_kv_size": g.shared_kv_size,
            "hosts": [{"name": h.name, "offset": h.offset, "size": h.size} for h in self.hosts],
            "epoch": self.epoch,
            "claim": self.claim,
            **({"members_version": self.members_version, "members_epoch": self.members_epoch}
               if self.format_version != FORMAT_VERSION else {}),
        }


# Fields that legitimately differ between a header on media and one built from a manifest.
RUNTIME_FIELDS = ("created_time", "created_by", "epoch", "claim", "members_version", "members_epoch")


def diff(ours: PoolHeader, theirs: PoolHeader, *, include_runtime: bool = False) -> list[tuple[str, Any, Any]]:
    """Field-by-field differences (field, ours, theirs); host entries as hosts[i].name etc."""
    out: list[tuple[str, Any, Any]] = []
    mine, found = ours.to_dict(), theirs.to_dict()
    for name, a in mine.items():
        if name == "hosts" or (name in RUNTIME_FIELDS and not include_runtime):
            continue
        b = found.get(name)
        if a != b:
            out.append((name, a, b))
    if len(ours.hosts) != len(theirs.hosts):
        out.append(("hosts.count", len(ours.hosts), len(theirs.hosts)))
    for i, (a, b) in enumerate(zip(ours.hosts, theirs.hosts, strict=False)):
        for name in ("name", "offset", "size"):
            if getattr(a, name) != getattr(b, name):
                out.append((f"hosts[{i}].{name}", getattr(a, name), getattr(b, name)))
    return out


GEOMETRY_FIELDS = (
    "format_version", "pool_size", "align", "rpc_offset", "rpc_ring_stride", "rpc_slots_per_ring",
    "rpc_slot_size", "journal_offset", "journal_size", "shared_kv_offset", "shared_kv_size",
)  # fmt: skip


def describe_change(ours: PoolHeader, theirs: PoolHeader) -> list[str]:
    """What an operator changed between the pool's header (`theirs`) and the manifest's (`ours`), in
    their words: hosts added, removed or reordered, ring count, geometry, or only who owns which ring."""
    mine, found = [h.name for h in ours.hosts], [h.name for h in theirs.hosts]
    out: list[str] = []
    if added := [n for n in mine if n not in found]:
        out.append("host(s) added: " + ", ".join(added))
    if removed := [n for n in found if n not in mine]:
        out.append("host(s) removed: " + ", ".join(removed))
    if not added and not removed and mine != found:
        out.append("hosts listed in another order")
    a, b = ours.to_dict(), theirs.to_dict()
    if a["rpc_ring_count"] != b["rpc_ring_count"]:
        out.append(f"CXL-RPC rings {b['rpc_ring_count']} -> {a['rpc_ring_count']} (vLLM processes added or removed)")
    if geometry := [f for f in GEOMETRY_FIELDS if a[f] != b[f]]:
        out.append("pool geometry: " + ", ".join(geometry))
    if not out and a["pool_uuid"] != b["pool_uuid"]:
        out.append("another pool uuid (another rack's pool, or the namespace uuid changed)")
    if not out and a["layout_hash"] != b["layout_hash"]:
        out.append("which vLLM process owns which ring (instance counts or tensor-parallel sizes)")
    return out


def pool_uuid(manifest: Manifest) -> str:
    """The namespace uuid the manifest pins; without one, a uuid derived from the rack name."""
    if manifest.pool.namespace is not None:
        return manifest.pool.namespace.uuid
    return str(uuid_mod.uuid5(uuid_mod.NAMESPACE_URL, f"belugactl:pool:{manifest.name}"))


# ---- the live words: claim and epoch --------------------------------------------------------
# Plain reads and writes at the fixed offsets, for a bytearray, memoryview or mmap. The atomic
# versions (compare-and-swap on the claim, fetch-add on the epoch) belong to the data plane's native
# helper; these are for inspection, tests and the single-writer paths.


def read_epoch(buf: Any) -> int:
    return _U64.unpack_from(buf, EPOCH_OFFSET)[0]


def write_epoch(buf: Any, epoch: int) -> None:
    _U64.pack_into(buf, EPOCH_OFFSET, epoch)


def read_claim(buf: Any) -> int:
    return _U64.unpack_from(buf, CLAIM_OFFSET)[0]


def write_claim(buf: Any, nonce: int) -> None:
    _U64.pack_into(buf, CLAIM_OFFSET, nonce)


def claim_tag(host_name: str) -> int:
    """The 32-bit tag of a host in the high half of its claim nonces (crc32 of its name, never 0).

    It makes a claim attributable: a host that crashed between its compare-and-swap and the magic
    finds its own tag on its next setup and takes the stale claim over (see docs/pool-format.md)."""
    return zlib.crc32(_fit_name(host_name).encode()) or 1


def claim_nonce(host_name: str, low: int | None = None) -> int:
    """A claim nonce: `claim_tag(host_name)` in bits 63..32, a random non-zero 32 bits below."""
    if low is None:
        low = int.from_bytes(os.urandom(4), "little") or 1
    return (claim_tag(host_name) << 32) | (low & 0xFFFFFFFF)


def claimed_by(claim: int, host_name: str) -> bool:
    """True when the claim word carries `host_name`'s tag (a nonce from `claim_nonce`)."""
    return claim != 0 and claim >> 32 == claim_tag(host_name)


def occupied_reason(area: Any) -> str | None:
    """None when every byte of `area` is zero; else what is there, for a message.

    Pass the whole header area (HEADER_REGION bytes, or as much of it as the device maps): a device
    whose magic and claim word are zero can still hold someone's data further in, and writing a
    header over it would destroy that. Doctor and setup both judge "blank" with this one function."""
    data = area if isinstance(area, bytes) else bytes(area)
    nonzero = len(data) - data.count(0)  # one pass in C over at most the 2 MiB header area
    if not nonzero:
        return None
    first = len(data) - len(data.lstrip(b"\0"))
    sample = data[first : first + 16].hex(" ")
    return (
        f"no header, but {nonzero} of the first {format_size(len(data))} are not zero "
        f"(the first at offset {first:#x}: {sample})"
    )


def is_blank(area: Any) -> bool:
    """Never initialized and holding nothing: every byte of the header area is zero (no magic, no
    claim, no data). See `occupied_reason` for why the whole area counts, not the first words."""
    return occupied_reason(area) is None


# ---- helpers --------------------------------------------------------------------------------


def _crc(record: bytearray | bytes) -> int:
    work = bytearray(record)
    work[CRC_OFFSET : CRC_OFFSET + 4] = bytes(4)
    for start, end in _LIVE_RANGES:
        work[start:end] = bytes(end - start)
    return zlib.crc32(work) & 0xFFFFFFFF


def _fit_name(name: str) -> str:
    """created_by is informational: cut a long host name at a character boundary to fit its field."""
    raw = name.replace("\0", "").encode()[:HOST_NAME_MAX]
    return raw.decode("utf-8", errors="ignore") or "unknown"


def _name_bytes(name: str, what: str) -> bytes:
    raw = name.encode()
    if not raw or len(raw) > HOST_NAME_MAX or b"\0" in raw:
        raise ValueError(f"{what} name {name!r} must be 1..{HOST_NAME_MAX} bytes without NUL")
    return raw.ljust(NAME_FIELD, b"\0")


def _name_from(raw: bytes, what: str) -> str:
    text, _, padding = raw.partition(b"\0")
    if not text or any(padding):
        raise _bad(f"{what}: the name field is empty or not NUL padded")
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what}: the name is not UTF-8") from None


def _bad(what: str, *, fix: str | None = None) -> InputError:
    return InputError(
        f"pool header: {what}",
        why="the bytes at pool offset 0 are not a valid belugactl header",
        fix=fix or "check that every host maps the same device; `belugactl pool show` prints the expected layout",
        where="pool offset 0",
    )
