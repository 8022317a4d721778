"""The metadata-server wire format, shared by the CXL slot rings and the TCP transport.

Every message is a 32-byte header followed by a payload; all integers little-endian.

    off size field
      0    8 status   slot state word (FREE / REQ_READY / RESP_READY); 0 and ignored over TCP
      8    8 seq      request sequence number, echoed in the reply
     16    4 magic    MAGIC; anything else is rejected
     20    4 epoch    low 32 bits of the pool epoch the client believes in / the server serves
     24    2 op       opcode (requests); echoed in replies
     26    2 code     result code (replies); 0 in requests
     28    4 length   payload bytes that follow
     32    .. payload

The status word sits in the same cache line as the rest of the header, so one line flush
publishes both. Payload layouts are in the `encode_*` / `decode_*` helpers below; every decode
bounds-checks and raises `ProtocolError` (never IndexError/struct.error) because the bytes come
from another process, possibly another host.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum

MAGIC = 0x554C4542  # b"BELU" read little-endian
HEADER = struct.Struct("<QQIIHHI")
HEADER_SIZE = HEADER.size  # 32
STATUS_OFFSET = 0

# Slot states. Only the owner of a transition writes it: the client FREE->REQ_READY and
# RESP_READY->FREE, the server REQ_READY->RESP_READY.
FREE = 0
REQ_READY = 1
RESP_READY = 2

# TCP frames are bounded so a hostile length cannot make the server allocate gigabytes.
TCP_MAX_PAYLOAD = 1 << 20

MAX_KEY = 255
MAX_NAMESPACE = 255

# A lease id is a keyed permutation of (sequence << LEASE_OWNER_BITS | owner): the owner is the
# ring index (CXL) or a connection number (TCP) the lease was granted to (mds/ownership.py).
LEASE_OWNER_BITS = 20


class Op(IntEnum):
    HELLO = 1
    OPEN_NS = 2
    LOOKUP_PREFIX = 3
    GET = 4
    RESERVE = 5
    COMMIT = 6
    ABORT = 7
    RELEASE = 8
    DELETE = 9
    CLEAR_NS = 10
    STATS = 11
    PING = 12
    GET_MANY = 13
    RESERVE_MANY = 14  # several keys of one namespace reserved in one message (docs/dataplane.md)
    COMMIT_MANY = 15  # several tokens committed (or aborted) in one message, each with its checksum
    REMOVALS = 16  # keys the server removed (evicted, deleted, cleared) since a cursor (docs/dataplane.md)


class Code(IntEnum):
    OK = 0
    NOT_FOUND = 1
    POOL_FULL = 2
    STALE_EPOCH = 3
    BAD_MAGIC = 4
    BAD_OP = 5
    BAD_LENGTH = 6
    BAD_ARGS = 7
    NO_RESERVATION = 8
    EXISTS = 9
    NOT_READY = 10
    TOO_BIG = 11
    BAD_SEQ = 12
    INTERNAL = 13
    UNKNOWN_NS = 14
    NOT_OWNER = 15  # COMMIT/ABORT/RELEASE of a token or lease another ring/connection got
    NS_LIMIT = 16  # max_namespaces namespaces are open and none is idle and empty
    NO_CHECKSUM = 17  # COMMIT (or a COMMIT_MANY item) without the block's CRC32C: every block carries one
    QUOTA = 18  # the client's tenant holds its manifest quota (reserved or stored bytes, namespaces, connections)


OPS = frozenset(int(o) for o in Op)


class ProtocolError(ValueError):
    """Bytes that do not form a valid message; carries the reply code to send back."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


def pack_header(buf, offset: int, *, status: int, seq: int, epoch: int, op: int, code: int, length: int) -> None:
    HEADER.pack_into(buf, offset, status, seq, MAGIC, epoch & 0xFFFFFFFF, op, code, length)


# --- payloads ---------------------------------------------------------------------------------
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HELLO_REQ = struct.Struct("<II")  # client_id, flags; then optionally u64 hand-over group (below)
_HELLO_REP = struct.Struct("<QIIII")  # full epoch, server pid, max payload, writer window (ms), lease TTL (ms)
_LOOKUP_REQ = struct.Struct("<IHH")  # ns, count, key length
_LOOKUP_REP = struct.Struct("<IIQ")  # present count, pad, lease id
_KEY_REQ = struct.Struct("<IH")  # ns, key length
_RESERVE_REQ = struct.Struct("<IHHQ")  # ns, key length, pad, nbytes
_GET_REP = struct.Struct("<QQHHI")  # lease id, nbytes, extent count, checksum kind, checksum (0, 0: none)
_RESERVE_REP = struct.Struct("<QHHI")  # token, extent count, pad, pad
_EXTENT = struct.Struct("<QQ")
_GET_REP_ONE = struct.Struct("<QQHHIQQ")  # _GET_REP and one _EXTENT, packed in one call
_RELEASE_REQ = struct.Struct("<HHI")  # count, flags, pad
# RELEASE flag: the leases were granted to another client, which passed them to this one (the vLLM
# scheduler looks blocks up, a worker copies and releases). Without it a lease of another owner is refused.
RELEASE_GRANTED_ELSEWHERE = 1
# HELLO may carry a u64 hand-over group after its 8 bytes: a secret the processes of one vLLM
# instance share (the plugin derives it from the engine's id). A RELEASE_GRANTED_ELSEWHERE is
# accepted only for leases granted to an owner of the releaser's group (0: none; such a client can
# release only its own leases). Older servers ignore the trailing bytes, as they ignore any.
_HELLO_GROUP = struct.Struct("<Q")
# After the group (then always present, 0 for none), HELLO may name the client's tenant: u8 length and
# the UTF-8 name (docs/dataplane.md, "Tenants"). Older servers ignore it; a HELLO without it is the
# implicit tenant's, or the tenant the connection's authentication bound it to.
MAX_TENANT_NAME = 63

STATS_FIELDS: tuple[str, ...] = (
    "epoch",
    "entries",
    "namespaces",
    "bytes_capacity",
    "bytes_used",
    "bytes_reserved",
    "reservations",
    "leases",
    "evictions",
    "reservations_reclaimed",
    "requests",
    "errors",
)
_STATS = struct.Struct("<" + "Q" * len(STATS_FIELDS))

Extent = tuple[int, int]

# Block checksums (docs/dataplane.md, "Checksums"). Every COMMIT carries one (the server refuses a
# commit without it: NO_CHECKSUM); GET and GET_MANY return it. Kind 0: none (what an old client's
# token-only COMMIT means, refused; a reader treats a location without one as corrupt); 1: CRC32C
# of the block's nbytes in extent order. The frame layout is the one old clients know.
CHECKSUM_NONE = 0
CHECKSUM_CRC32C = 1
CHECKSUM_KINDS = frozenset({CHECKSUM_NONE, CHECKSUM_CRC32C})
_COMMIT_REQ = struct.Struct("<QII")  # token, checksum, checksum kind


def _need(data: bytes | memoryview, size: int, what: str) -> None:
    if len(data) < size:
        raise ProtocolError(Code.BAD_LENGTH, f"{what}: payload of {len(data)} bytes, need {size}")


def encode_hello(client_id: int, flags: int = 0, handover_group: int = 0, tenant: str = "") -> bytes:
    head = _HELLO_REQ.pack(client_id & 0xFFFFFFFF, flags)
    if tenant:
        name = tenant.encode()
        if not 0 < len(name) <= MAX_TENANT_NAME:
            raise ValueError(f"a tenant name is 1 to {MAX_TENANT_NAME} bytes, got {len(name)}")
        return head + _HELLO_GROUP.pack(handover_group) + bytes((len(name),)) + name
    return head + _HELLO_GROUP.pack(handover_group) if handover_group else head


def decode_hello(data) -> tuple[int, int]:
    _need(data, _HELLO_REQ.size, "HELLO")
    return _HELLO_REQ.unpack_from(data, 0)


def decode_hello_group(data) -> int:
    """The hand-over group a HELLO carries (0: none, or a client from before groups)."""
    if len(data) < _HELLO_REQ.size + _HELLO_GROUP.size:
        return 0
    return _HELLO_GROUP.unpack_from(data, _HELLO_REQ.size)[0]


def decode_hello_tenant(data) -> str:
    """The tenant a HELLO names ("": none, or a client from before tenants)."""
    at = _HELLO_REQ.size + _HELLO_GROUP.size
    if len(data) <= at:
        return ""
    n = data[at]
    if n == 0 or n > MAX_TENANT_NAME or len(data) < at + 1 + n:
        raise ProtocolError(Code.BAD_LENGTH, f"HELLO: tenant name length {n} does not fit {len(data) - at - 1} bytes")
    try:
        return bytes(data[at + 1 : at + 1 + n]).decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(Code.BAD_ARGS, "HELLO: tenant name is not UTF-8") from exc


def encode_hello_reply(
    epoch: int, pid: int, max_payload: int, writer_window_ms: int, lease_ttl_ms: int = 0, batch_items: int = 0
) -> bytes:
    """writer_window_ms: how long after sending RESERVE a writer may still write the extents it got
    (the client abandons the reservation after that; docs/dataplane.md, "Fencing"). lease_ttl_ms:
    how long a read lease lives at least after the request that took it was sent (a reader that
    finished its copy within that needs no live count from its release: docs/dataplane.md, "Leases").
    batch_items: see `decode_hello_batch`."""
    mask = 0xFFFFFFFF
    rep = _HELLO_REP.pack(epoch, pid & mask, max_payload, writer_window_ms & mask, lease_ttl_ms & mask)
    return rep + _HELLO_BATCH.pack(batch_items & mask) if batch_items else rep


# After the reply's 24 bytes a server may add a u32: the keys or tokens it handles per RESERVE_MANY
# or COMMIT_MANY (docs/dataplane.md, "Batched puts"). Older clients ignore it, as any trailing bytes.
_HELLO_BATCH = struct.Struct("<I")


def decode_hello_batch(data) -> int:
    """How many items a RESERVE_MANY or COMMIT_MANY should carry at most: a RESERVE_MANY past it is
    answered in part (the caller asks again for the rest), a COMMIT_MANY past it is answered whole
    but holds the server's loop for its length. 0: the server gives no advice (an older one)."""
    if len(data) < _HELLO_REP.size + _HELLO_BATCH.size:
        return 0
    return _HELLO_BATCH.unpack_from(data, _HELLO_REP.size)[0]


def decode_hello_reply(data) -> tuple[int, int, int, int, int]:
    """(epoch, pid, max payload, writer window ms, lease TTL ms). Older servers answer shorter: 16
    bytes (no writer window) or 20 (no lease TTL); a missing field reads 0, "unknown" (clients then
    assume DEFAULT_WRITER_WINDOW_MS, and trust no lease by time)."""
    if len(data) == _HELLO_REP.size - 8:
        return (*struct.unpack_from("<QII", data, 0), 0, 0)
    if len(data) == _HELLO_REP.size - 4:
        return (*struct.unpack_from("<QIII", data, 0), 0)
    _need(data, _HELLO_REP.size, "HELLO reply")
    return _HELLO_REP.unpack_from(data, 0)


DEFAULT_WRITER_WINDOW_MS = 30_000  # the reservation TTL servers have always defaulted to


def encode_name(name: str) -> bytes:
    raw = name.encode()
    if not 0 < len(raw) <= MAX_NAMESPACE:
        raise ValueError(f"namespace must be 1..{MAX_NAMESPACE} bytes of UTF-8, got {len(raw)}")
    return bytes([len(raw)]) + raw


def decode_name(data) -> str:
    _need(data, 1, "OPEN_NS")
    n = data[0]
    if n == 0 or len(data) < 1 + n:
        raise ProtocolError(Code.BAD_LENGTH, f"OPEN_NS: name length {n} does not fit {len(data)} bytes")
    try:
        return bytes(data[1 : 1 + n]).decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(Code.BAD_ARGS, "OPEN_NS: name is not UTF-8") from exc


def encode_u32(v: int) -> bytes:
    return _U32.pack(v)


def decode_u32(data, what: str) -> int:
    _need(data, 4, what)
    return _U32.unpack_from(data, 0)[0]


def encode_u64(v: int) -> bytes:
    return _U64.pack(v)


def decode_u64(data, what: str) -> int:
    _need(data, 8, what)
    return _U64.unpack_from(data, 0)[0]


def _check_key_len(klen: int, what: str) -> None:
    if not 0 < klen <= MAX_KEY:
        raise ProtocolError(Code.BAD_ARGS, f"{what}: key length {klen} outside 1..{MAX_KEY}")


def lookup_capacity(max_payload: int, key_len: int) -> int:
    """How many keys of `key_len` bytes one LOOKUP_PREFIX request can carry."""
    return max(0, (max_payload - _LOOKUP_REQ.size) // key_len)


# The largest GET_MANY reply the server's native fast path builds (its stack buffer; the C code
# takes it from the generated _native_wire.h). With slots larger than this, a message of more keys
# than fit it would be answered in part and the rest asked for in a second round trip.
FAST_REPLY_MAX = 4096


def get_many_capacity(max_payload: int, key_len: int) -> int:
    """How many keys one GET_MANY message should carry: what the request holds, and what the reply
    holds when each block is one extent (a reply that cannot carry every key answers a prefix), no
    more than the native fast path answers at once (so a long prompt is one pipelined burst)."""
    reply = (min(max_payload, FAST_REPLY_MAX) - _MANY_REP.size) // (_MANY_ITEM.size + _EXTENT.size)
    return max(1, min(lookup_capacity(max_payload, key_len), reply))


def encode_lookup(ns: int, keys: Sequence[bytes]) -> bytes:
    klen = len(keys[0])
    if len(keys) == 1:
        return _LOOKUP_REQ.pack(ns, 1, klen) + keys[0]
    if any(len(k) != klen for k in keys):
        raise ValueError("all keys of one prefix lookup must have the same length")
    return _LOOKUP_REQ.pack(ns, len(keys), klen) + b"".join(keys)


def decode_lookup(data) -> tuple[int, list[bytes]]:
    _need(data, _LOOKUP_REQ.size, "LOOKUP_PREFIX")
    ns, count, klen = _LOOKUP_REQ.unpack_from(data, 0)
    _check_key_len(klen, "LOOKUP_PREFIX")
    end = _LOOKUP_REQ.size + count * klen
    if count == 0 or len(data) < end:
        raise ProtocolError(Code.BAD_LENGTH, f"LOOKUP_PREFIX: {count} keys of {klen} bytes do not fit {len(data)}")
    raw = bytes(data[_LOOKUP_REQ.size : end])
    return ns, [raw[i : i + klen] for i in range(0, len(raw), klen)]


def encode_lookup_reply(count: int, lease: int) -> bytes:
    return _LOOKUP_REP.pack(count, 0, lease)


def decode_lookup_reply(data) -> tuple[int, int]:
    _need(data, _LOOKUP_REP.size, "LOOKUP_PREFIX reply")
    count, _pad, lease = _LOOKUP_REP.unpack_from(data, 0)
    return count, lease


def encode_key(ns: int, key: bytes) -> bytes:
    return _KEY_REQ.pack(ns, len(key)) + key


def decode_key(data, what: str) -> tuple[int, bytes]:
    _need(data, _KEY_REQ.size, what)
    ns, klen = _KEY_REQ.unpack_from(data, 0)
    _check_key_len(klen, what)
    end = _KEY_REQ.size + klen
    _need(data, end, what)
    return ns, bytes(data[_KEY_REQ.size : end])


def encode_reserve(ns: int, key: bytes, nbytes: int) -> bytes:
    return _RESERVE_REQ.pack(ns, len(key), 0, nbytes) + key


def decode_reserve(data) -> tuple[int, bytes, int]:
    _need(data, _RESERVE_REQ.size, "RESERVE")
    ns, klen, _pad, nbytes = _RESERVE_REQ.unpack_from(data, 0)
    _check_key_len(klen, "RESERVE")
    end = _RESERVE_REQ.size + klen
    _need(data, end, "RESERVE")
    if nbytes == 0:
        raise ProtocolError(Code.BAD_ARGS, "RESERVE: zero bytes")
    return ns, bytes(data[_RESERVE_REQ.size : end]), nbytes


def _pack_extents(extents: Sequence[Extent]) -> bytes:
    if len(extents) == 1:  # most replies: one extent (a restart encodes one reply per block)
        return _EXTENT.pack(*extents[0])
    return b"".join([_EXTENT.pack(o, n) for o, n in extents])


def _unpack_extents(data, start: int, count: int, what: str) -> list[Extent]:
    _need(data, start + count * _EXTENT.size, what)
    return [_EXTENT.unpack_from(data, start + i * _EXTENT.size) for i in range(count)]


def extents_capacity(max_payload: int) -> int:
    """How many extents fit in a GET or RESERVE reply of `max_payload` bytes."""
    return (max_payload - max(_GET_REP.size, _RESERVE_REP.size)) // _EXTENT.size


_MANY_REP = struct.Struct("<HH")  # blocks answered, pad
# lease id (0: absent), nbytes, extent count, checksum kind, checksum (the GET reply's head)
_MANY_ITEM = struct.Struct("<QQHHI")


def _checksum_fields(checksum: int | None) -> tuple[int, int]:
    if checksum is None:
        return CHECKSUM_NONE, 0
    if not 0 <= checksum <= 0xFFFFFFFF:
        raise ValueError(f"checksum {checksum} is not a 32-bit CRC32C")
    return CHECKSUM_CRC32C, checksum


def _checksum_of(kind: int, crc: int, what: str) -> int | None:
    if kind == CHECKSUM_NONE:
        return None
    if kind != CHECKSUM_CRC32C:
        raise ProtocolError(Code.BAD_ARGS, f"{what}: unknown checksum kind {kind}")
    return crc


def encode_get_many_item(lease: int, nbytes: int, extents: Sequence[Extent], checksum: int | None = None) -> bytes:
    kind, crc = _checksum_fields(checksum)
    return _MANY_ITEM.pack(lease, nbytes, len(extents), kind, crc) + _pack_extents(extents)


Area = tuple[int, int]  # [start, end) of the shared KV area, from the pool header
ANYWHERE: Area = (0, (1 << 64) - 1)  # no bound: a decoder that does not know the pool


def extents_outside(extents: Sequence[Extent], area: Area) -> Extent | None:
    """The first extent not inside `area`, or None. A reply's extents come from whoever answered on
    the port: one outside the shared KV area (over the header, another host's partition) is refused
    before any byte is written or read."""
    lo, hi = area
    for extent in extents:
        off, n = extent
        if off < lo or off > hi or n > hi - off:
            return extent
    return None


def decode_get_many_reply_ex(data, area: Area = ANYWHERE) -> list[tuple[int, int, list[Extent], int | None]]:
    """(lease id, nbytes, extents, checksum or None) per key answered, in order; lease 0 means absent.
    A located block's extent outside `area` raises ProtocolError (BAD_ARGS).

    Written flat (no helper calls per item): the scheduler decodes a long prompt's whole lookup on
    a pool hit's critical path."""
    _need(data, _MANY_REP.size, "GET_MANY reply")
    count = _MANY_REP.unpack_from(data, 0)[0]
    size = len(data)
    item = _MANY_ITEM.unpack_from
    extent = _EXTENT.unpack_from
    isz, esz = _MANY_ITEM.size, _EXTENT.size
    out = []
    pos = _MANY_REP.size
    for _ in range(count):
        if pos + isz > size:
            _need(data, pos + isz, "GET_MANY reply")
        lease, nbytes, n, kind, crc = item(data, pos)
        pos += isz
        end = pos + n * esz
        if end > size:
            _need(data, end, "GET_MANY reply")
        if kind == CHECKSUM_CRC32C:
            checksum: int | None = crc
        elif kind == CHECKSUM_NONE:
            checksum = None
        else:
            raise ProtocolError(Code.BAD_ARGS, f"GET_MANY reply: unknown checksum kind {kind}")
        extents = [extent(data, pos)] if n == 1 else [extent(data, pos + i * esz) for i in range(n)]
        if lease and area != ANYWHERE:
            bad = extents_outside(extents, area)
            if bad is not None:
                raise ProtocolError(Code.BAD_ARGS, f"GET_MANY reply: extent {bad} outside the shared KV area {area}")
        out.append((lease, nbytes, extents, checksum))
        pos = end
    return out


LocationTuple = tuple[list[Extent], int, int, int | None]  # extents, lease id, nbytes, checksum


def decode_get_many_tuples(data, area: Area = ANYWHERE) -> list[LocationTuple | None]:
    """A GET_MANY reply as (extents, lease id, nbytes, checksum or None) per key answered, None for
    an absent one: the vLLM connector's own shape, built in C when the native helper is there
    (`get_many_decode`: the same checks as decode_get_many_reply_ex, a malformed reply or an extent
    outside `area` raises ProtocolError either way)."""
    from belugactl.dataplane import native  # here, not at import: native is optional

    fast = native.optional("get_many_decode")
    if fast is not None:
        try:
            return fast(data, *area)
        except ValueError as exc:
            raise ProtocolError(Code.BAD_LENGTH, str(exc)) from None
    return [
        None if not lease else (extents, lease, nbytes, checksum)
        for lease, nbytes, extents, checksum in decode_get_many_reply_ex(data, area)
    ]


def decode_get_many_reply(data) -> list[tuple[int, int, list[Extent]]]:
    """(lease id, nbytes, extents) per key answered, in order; lease 0 means absent."""
    return [(lease, nbytes, extents) for lease, nbytes, extents, _c in decode_get_many_reply_ex(data)]


def encode_get_reply(lease: int, nbytes: int, extents: Sequence[Extent], checksum: int | None = None) -> bytes:
    kind, crc = _checksum_fields(checksum)
    if len(extents) == 1:  # most blocks; every commit and a restart's every entry make one for the mirror
        off, n = extents[0]
        return _GET_REP_ONE.pack(lease, nbytes, 1, kind, crc, off, n)
    return _GET_REP.pack(lease, nbytes, len(extents), kind, crc) + _pack_extents(extents)


def encode_get_reply_one(nbytes: int, off: int, n: int, checksum: int) -> bytes:
    """`encode_get_reply(0, nbytes, [(off, n)], checksum)` for a checksum already known to be a u32:
    the native mirror's reply of a one-extent block, made for every entry a restart restores."""
    return _GET_REP_ONE.pack(0, nbytes, 1, CHECKSUM_CRC32C, checksum, off, n)


def decode_get_reply_ex(data) -> tuple[int, int, list[Extent], int | None]:
    """(lease id, nbytes, extents, checksum or None)."""
    _need(data, _GET_REP.size, "GET reply")
    lease, nbytes, count, kind, crc = _GET_REP.unpack_from(data, 0)
    checksum = _checksum_of(kind, crc, "GET reply")
    return lease, nbytes, _unpack_extents(data, _GET_REP.size, count, "GET reply"), checksum


def decode_get_reply(data) -> tuple[int, int, list[Extent]]:
    return decode_get_reply_ex(data)[:3]  # type: ignore[return-value]


def encode_commit(token: int, checksum: int) -> bytes:
    """16 bytes: token, CRC32C, kind. The checksum is required (the server refuses a commit without one)."""
    kind, crc = _checksum_fields(_required_checksum(checksum, "COMMIT"))
    return _COMMIT_REQ.pack(token, crc, kind)


def _required_checksum(checksum: object, what: str) -> int:
    # Caught at the caller, before a frame leaves: the server would refuse it anyway (NO_CHECKSUM).
    if not isinstance(checksum, int) or isinstance(checksum, bool):
        raise ValueError(f"{what}: a commit needs the block's CRC32C (native.crc32c), got {checksum!r}")
    return checksum


def decode_commit(data) -> tuple[int, int | None]:
    """(token, checksum or None). A payload of 8..15 bytes is token-only (an old client): None, which
    the server refuses with NO_CHECKSUM."""
    _need(data, 8, "COMMIT")
    if len(data) < _COMMIT_REQ.size:
        return _U64.unpack_from(data, 0)[0], None
    token, crc, kind = _COMMIT_REQ.unpack_from(data, 0)
    return token, _checksum_of(kind, crc, "COMMIT")


def encode_reserve_reply(token: int, extents: Sequence[Extent]) -> bytes:
    return _RESERVE_REP.pack(token, len(extents), 0, 0) + _pack_extents(extents)


def decode_reserve_reply(data) -> tuple[int, list[Extent]]:
    _need(data, _RESERVE_REP.size, "RESERVE reply")
    token, count, _a, _b = _RESERVE_REP.unpack_from(data, 0)
    return token, _unpack_extents(data, _RESERVE_REP.size, count, "RESERVE reply")


def release_capacity(max_payload: int) -> int:
    return (max_payload - _RELEASE_REQ.size) // 8


def encode_release(lease_ids: Sequence[int], flags: int = 0) -> bytes:
    # One pack call for the head and every id: a worker sends this right after its copy, when little
    # of the interpreter is in the CPU caches, and a pack per id touches far more there.
    n = len(lease_ids)
    return struct.pack(f"<HHI{n}Q", n, flags, 0, *lease_ids)


def decode_release_raw(data) -> tuple[bytes, int]:
    """(the lease ids as little-endian u64 bytes, flags): what the server decodes in one native call."""
    _need(data, _RELEASE_REQ.size, "RELEASE")
    count, flags, _pad = _RELEASE_REQ.unpack_from(data, 0)
    end = _RELEASE_REQ.size + 8 * count
    _need(data, end, "RELEASE")
    return bytes(data[_RELEASE_REQ.size : end]), flags


def decode_release(data) -> list[int]:
    return decode_release_flags(data)[0]


def decode_release_flags(data) -> tuple[list[int], int]:
    _need(data, _RELEASE_REQ.size, "RELEASE")
    count, flags, _pad = _RELEASE_REQ.unpack_from(data, 0)
    end = _RELEASE_REQ.size + 8 * count
    _need(data, end, "RELEASE")
    return list(struct.unpack_from(f"<{count}Q", data, _RELEASE_REQ.size)), flags


def encode_stats(values: dict[str, int]) -> bytes:
    return _STATS.pack(*(max(0, int(values.get(k, 0))) for k in STATS_FIELDS))


def decode_stats(data) -> dict[str, int]:
    _need(data, _STATS.size, "STATS reply")
    return dict(zip(STATS_FIELDS, _STATS.unpack_from(data, 0), strict=True))


# --- batched two-phase put (RESERVE_MANY, COMMIT_MANY; docs/dataplane.md, "Batched puts") ------
# RESERVE_MANY request: the LOOKUP_PREFIX head (ns, count, key length), then `count` items of
# (u64 nbytes, key). Reply: (u16 answered, u16 pad), then per answered item (u64 token, u16 code,
# u16 extent count, u32 pad) and its extents; code 0 carries a reservation, any other none.
_RESERVE_MANY_ITEM = struct.Struct("<QHHI")
# COMMIT_MANY request: (u16 count, u16 flags 0, u32 pad), then `count` items of (u64 token, u32
# checksum, u16 checksum kind, u16 action). Reply: (u16 count, u16 pad), then a u16 code per item.
_COMMIT_MANY_REQ = struct.Struct("<HHI")
_COMMIT_MANY_ITEM = struct.Struct("<QIHH")
COMMIT_MANY_COMMIT = 0
COMMIT_MANY_ABORT = 1  # give the reservation back (what ABORT does), e.g. one fenced before it was written
_MAX_COUNT = 0xFFFF  # counts are u16 on the wire


def reserve_many_capacity(max_payload: int, key_len: int) -> int:
    """How many keys of `key_len` bytes one RESERVE_MANY request can carry."""
    if key_len <= 0:
        return 0
    return max(0, min(_MAX_COUNT, (max_payload - _LOOKUP_REQ.size) // (8 + key_len)))


def commit_many_capacity(max_payload: int) -> int:
    """How many tokens one COMMIT_MANY request can carry (its reply, 2 bytes a token, always fits)."""
    return max(0, min(_MAX_COUNT, (max_payload - _COMMIT_MANY_REQ.size) // _COMMIT_MANY_ITEM.size))


def encode_reserve_many(ns: int, items: Sequence[tuple[bytes, int]]) -> bytes:
    """`items`: (key, nbytes) pairs, every key of the same length (one message carries one length)."""
    if not items or len(items) > _MAX_COUNT:
        raise ValueError(f"RESERVE_MANY carries 1..{_MAX_COUNT} keys, got {len(items)}")
    klen = len(items[0][0])
    if any(len(k) != klen for k, _n in items):
        raise ValueError("all keys of one RESERVE_MANY request must have the same length")
    return _LOOKUP_REQ.pack(ns, len(items), klen) + b"".join(_U64.pack(n) + k for k, n in items)


def decode_reserve_many(data) -> tuple[int, list[tuple[bytes, int]]]:
    """(ns, [(key, nbytes)]); the whole request is refused (nothing reserved) if any item is bad."""
    _need(data, _LOOKUP_REQ.size, "RESERVE_MANY")
    ns, count, klen = _LOOKUP_REQ.unpack_from(data, 0)
    _check_key_len(klen, "RESERVE_MANY")
    step = 8 + klen
    end = _LOOKUP_REQ.size + count * step
    if count == 0 or len(data) < end:
        raise ProtocolError(Code.BAD_LENGTH, f"RESERVE_MANY: {count} items of {step} bytes do not fit {len(data)}")
    raw = bytes(data[_LOOKUP_REQ.size : end])
    items = []
    for pos in range(0, len(raw), step):
        nbytes = _U64.unpack_from(raw, pos)[0]
        if nbytes == 0:
            raise ProtocolError(Code.BAD_ARGS, f"RESERVE_MANY: item {pos // step} asks for zero bytes")
        items.append((raw[pos + 8 : pos + step], nbytes))
    return ns, items


def encode_reserve_many_item(code: int, token: int = 0, extents: Sequence[Extent] = ()) -> bytes:
    return _RESERVE_MANY_ITEM.pack(token, code, len(extents), 0) + _pack_extents(extents)


RESERVE_MANY_ITEM_SIZE = _RESERVE_MANY_ITEM.size  # a refused item's whole size in the reply


def encode_many_reply(items: Sequence[bytes]) -> bytes:
    return _MANY_REP.pack(len(items), 0) + b"".join(items)


def decode_reserve_many_reply(data) -> list[tuple[int, int, list[Extent]]]:
    """(code, token, extents) per item answered, in request order (fewer than asked: ask again for the rest)."""
    _need(data, _MANY_REP.size, "RESERVE_MANY reply")
    count = _MANY_REP.unpack_from(data, 0)[0]
    out = []
    pos = _MANY_REP.size
    for _ in range(count):
        _need(data, pos + _RESERVE_MANY_ITEM.size, "RESERVE_MANY reply")
        token, code, n, _pad = _RESERVE_MANY_ITEM.unpack_from(data, pos)
        pos += _RESERVE_MANY_ITEM.size
        out.append((code, token, _unpack_extents(data, pos, n, "RESERVE_MANY reply")))
        pos += n * _EXTENT.size
    return out


def encode_commit_many(items: Sequence[tuple[int, int | None, int]]) -> bytes:
    """`items`: (token, checksum, action COMMIT_MANY_COMMIT / COMMIT_MANY_ABORT); an abort's checksum
    is None, a commit's is required."""
    if not items or len(items) > _MAX_COUNT:
        raise ValueError(f"COMMIT_MANY carries 1..{_MAX_COUNT} tokens, got {len(items)}")
    out = [_COMMIT_MANY_REQ.pack(len(items), 0, 0)]
    for token, checksum, action in items:
        if action == COMMIT_MANY_COMMIT:
            checksum = _required_checksum(checksum, "COMMIT_MANY")
        kind, crc = _checksum_fields(checksum)
        out.append(_COMMIT_MANY_ITEM.pack(token, crc, kind, action))
    return b"".join(out)


def decode_commit_many(data) -> list[tuple[int, int | None, int]]:
    """[(token, checksum or None, action)]; the whole request is refused (nothing done) if any item is bad."""
    _need(data, _COMMIT_MANY_REQ.size, "COMMIT_MANY")
    count, flags, _pad = _COMMIT_MANY_REQ.unpack_from(data, 0)
    if flags:
        raise ProtocolError(Code.BAD_ARGS, f"COMMIT_MANY: unknown flags {flags:#x}")
    end = _COMMIT_MANY_REQ.size + count * _COMMIT_MANY_ITEM.size
    if count == 0 or len(data) < end:
        raise ProtocolError(Code.BAD_LENGTH, f"COMMIT_MANY: {count} tokens do not fit {len(data)} bytes")
    out = []
    for i in range(count):
        at = _COMMIT_MANY_REQ.size + i * _COMMIT_MANY_ITEM.size
        token, crc, kind, action = _COMMIT_MANY_ITEM.unpack_from(data, at)
        if action not in (COMMIT_MANY_COMMIT, COMMIT_MANY_ABORT):
            raise ProtocolError(Code.BAD_ARGS, f"COMMIT_MANY: item {i} has unknown action {action}")
        out.append((token, _checksum_of(kind, crc, "COMMIT_MANY"), action))
    return out


def encode_codes_reply(codes: Sequence[int]) -> bytes:
    return _MANY_REP.pack(len(codes), 0) + struct.pack(f"<{len(codes)}H", *codes)


def decode_codes_reply(data, what: str) -> list[int]:
    _need(data, _MANY_REP.size, what)
    count = _MANY_REP.unpack_from(data, 0)[0]
    _need(data, _MANY_REP.size + 2 * count, what)
    return list(struct.unpack_from(f"<{count}H", data, _MANY_REP.size))


# --- REMOVALS: keys removed since a cursor (docs/dataplane.md, "Removal events") ----------------
# Request: u64 cursor (the sequence number of the first removal wanted; 0 and 1: from the first),
# u32 namespace id (0: every namespace), u16 max items (0: no items, only the reply's head),
# u16 flags (0). Reply: u64 next cursor (ask with it next time), u64 head (the sequence number the
# next removal will get: caught up when next == head), u32 lost (removals at or after the cursor
# the bounded log no longer holds), u16 count, u16 pad; then `count` items of u32 namespace id,
# u8 why, u8 key length, key.
_REMOVALS_REQ = struct.Struct("<QIHH")
_REMOVALS_REP = struct.Struct("<QQIHH")
_REMOVAL_ITEM = struct.Struct("<IBB")
REMOVALS_REPLY_HEAD = _REMOVALS_REP.size
REMOVAL_WHY = {1: "evicted", 2: "deleted", 3: "cleared"}  # mds/removal_log.py WHY_*


def removals_capacity(max_payload: int, key_len: int) -> int:
    """How many removals of `key_len`-byte keys one REMOVALS reply of `max_payload` bytes carries."""
    if key_len <= 0:
        return 0
    return max(0, min(_MAX_COUNT, (max_payload - _REMOVALS_REP.size) // (_REMOVAL_ITEM.size + key_len)))


def removal_item_size(key_len: int) -> int:
    return _REMOVAL_ITEM.size + key_len


def encode_removals(cursor: int, ns: int = 0, max_items: int = _MAX_COUNT) -> bytes:
    if not 0 <= cursor < 1 << 64:
        raise ValueError(f"REMOVALS cursor {cursor} is not a u64")
    if not 0 <= max_items <= _MAX_COUNT:
        raise ValueError(f"REMOVALS max items {max_items} outside 0..{_MAX_COUNT}")
    return _REMOVALS_REQ.pack(cursor, ns, max_items, 0)


def decode_removals(data) -> tuple[int, int, int]:
    """(cursor, namespace id or 0, max items)."""
    _need(data, _REMOVALS_REQ.size, "REMOVALS")
    cursor, ns, max_items, flags = _REMOVALS_REQ.unpack_from(data, 0)
    if flags:
        raise ProtocolError(Code.BAD_ARGS, f"REMOVALS: unknown flags {flags:#x}")
    return cursor, ns, max_items


def encode_removal_item(ns: int, why: int, key: bytes) -> bytes:
    return _REMOVAL_ITEM.pack(ns, why, len(key)) + key


def encode_removals_reply(next_cursor: int, head: int, lost: int, items: Sequence[bytes]) -> bytes:
    return _REMOVALS_REP.pack(next_cursor, head, min(lost, 0xFFFFFFFF), len(items), 0) + b"".join(items)


def decode_removals_reply(data) -> tuple[int, int, int, list[tuple[int, int, bytes]]]:
    """(next cursor, head, lost, [(namespace id, why, key)])."""
    _need(data, _REMOVALS_REP.size, "REMOVALS reply")
    next_cursor, head, lost, count, _pad = _REMOVALS_REP.unpack_from(data, 0)
    pos = _REMOVALS_REP.size
    out = []
    for _ in range(count):
        _need(data, pos + _REMOVAL_ITEM.size, "REMOVALS reply")
        ns, why, klen = _REMOVAL_ITEM.unpack_from(data, pos)
        pos += _REMOVAL_ITEM.size
        _need(data, pos + klen, "REMOVALS reply")
        out.append((ns, why, bytes(data[pos : pos + klen])))
        pos += klen
    if next_cursor > head:
        raise ProtocolError(Code.BAD_ARGS, f"REMOVALS reply: next cursor {next_cursor} past head {head}")
    return next_cursor, head, lost, out
