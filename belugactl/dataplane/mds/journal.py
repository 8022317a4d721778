"""The index journal in the pool's metadata area: optional restart policy `journal` (default: start empty).

With it, every commit and every removal is appended to the journal before the server answers, and
a restarted server rebuilds the index from it, so the cache survives a metadata-server restart.
Only committed blocks are ever journaled: a block reserved but not committed when the server died
was never visible and is not after the restart. The epoch still moves on every start, so leases,
reservations and requests of the previous incarnation stay fenced.

Layout of the journal area (`layout.journal`):

    0     8  magic b"BLGJRNL1"
    8     8  state word: generation << 1 | active half   (one 8-byte store switches halves)
    64    16 the fence line (fencing.py)
    128   .. the stop record, when journaling had to stop: b"BLGJSTOP", u64 wall-clock ns, u64 epoch,
             u16 reason length, the reason (UTF-8, at most 512 bytes); zeros otherwise
    4096  .. half 0, then half 1 (each (size - 4096) // 2 bytes)

A half is a sequence of records: u32 body length, u32 crc32(generation, body), body. Replay stops
at the first record whose crc does not match (the end, a torn write, or an older generation's
leftovers). Bodies:
    1 COMMIT: u16 ns length, ns, u16 key length, key, u64 nbytes, u16 block count, (u64 size, u64 offset)*,
              then optionally u16 checksum kind, u32 checksum (the writer's CRC32C; rpc/protocol.py)
    2 REMOVE: u16 ns length, ns, u16 key length, key
    3 ORDER:  u16 0, u16 0, u32 interleave ways, u64 granularity   (first record of a half)
ORDER says how the blocks of the COMMITs that follow are ordered: with software interleave
(ways > 1) in placement order, which is the order of the block's bytes; without it the bytes run
lowest offset first. A half without ORDER (an older journal) is read as "no interleave". A server
whose interleave differs from the journal's would lay a block's bytes out in another order than
its writer did, so it starts empty instead of restoring.
Compaction writes the live index into the other half under the next generation, then flips the
state word to it. The running server does it in steps (`JournalKeeper.compact_step`, COMPACT_STEP
entries between loop turns, walking the index's slab) once half of the active half's room is used;
records appended meanwhile go to both halves, so the old half stays whole until the flip and the new
one misses nothing. A start-up rebuild compacts at once, so a replayed journal is always compacted.
At a restart the native helper replays a half (`replay_live`: scan, crc check, parse and merge in
_native_journal.c, Python objects only for what stays live) and the start-up compaction copies the
live records' bodies as they are (`Journal.rewrite_copy`); `replay` and `rewrite` are the Python
twins, used without the helper and tested against it.

Journaling stops only when it must (the live index does not fit one half, a write failed). It
then clears the magic (a stale journal could restore blocks whose space is handed out again
afterwards) and writes the stop record, so that nothing is silently empty: the running server's
`/readyz` answers 503 with the reason and `beluga_mds_journal_stopped` is 1; doctor's
`metadata.journal` reads the stop record from the pool; the next start says it restored nothing
because the previous journal stopped (`journal.previous_stop` in /stats,
`beluga_mds_journal_lost_at_start`), and clears the record once its own journal is written.

The checksum trailer needs no new format version: a reader from before it stops at the block list
and ignores the 6 bytes after it (records are length-prefixed). A COMMIT without the trailer (an
old journal, from when a writer could commit without a checksum) is not restored: every served
block carries its CRC32C, so such a block stays out of the index, its space free
(`unchecked_dropped` in the stats, and the note says how many).
"""

from __future__ import annotations

import gc
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from belugactl.dataplane import native
from belugactl.dataplane.mds.allocator import CHUNK, PackedShapes

if TYPE_CHECKING:
    from belugactl.dataplane.mds.allocator import Allocator
    from belugactl.dataplane.mds.index import Entry, KVIndex
    from belugactl.dataplane.mds.journal_follow import JournalFollower
    from belugactl.pool.mapping import PoolMapping

MAGIC = b"BLGJRNL1"
HEADER = 4096
COMMIT = 1
REMOVE = 2
ORDER = 3
NO_INTERLEAVE = (1, 2 << 20)  # (ways, granularity) of an allocator without software interleave
_ORDER = struct.Struct("<BHHIQ")  # kind, 0, 0, ways, granularity
_REC = struct.Struct("<II")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_BLOCK = struct.Struct("<QQ")
_CHECKSUM = struct.Struct("<HI")  # kind, CRC32C
_HEAD = struct.Struct("<QH")  # a COMMIT's nbytes, block count
_ONE_CHECKED = struct.Struct("<QHQQHI")  # the same with its one block and its checksum: most records
_END = bytes(_REC.size)  # a zero length: no record here
CHECKSUM_CRC32C = 1  # rpc/protocol.py's CHECKSUM_CRC32C
SCAN_FLUSH = 4 << 20  # replay on a non-coherent pool invalidates this much ahead at a time
REWRITE_CHUNK = 4 << 20  # a compaction writes its records this much at a time
# The running server's compaction walks the live index this many entries a step, between its loop
# turns (about 2 us an entry to pack), so no step grows with the index.
COMPACT_STEP = 1024
STOP_AT = 128  # the stop record's offset in the area's header
STOP_MAGIC = b"BLGJSTOP"
_STOP = struct.Struct("<8sQQH")  # magic, wall-clock ns, epoch, reason length
STOP_REASON_MAX = 512


@dataclass
class StopRecord:
    """Why and when journaling stopped (the record in the journal area's header)."""

    at_ns: int
    epoch: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"at_ns": self.at_ns, "epoch": self.epoch, "reason": self.reason}


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while millions of live entries are made, and all of it frozen after: the
    GC would otherwise walk the growing index again and again (a rebuild or a standby's first sync
    of 1 M blocks nearly doubled in-process: docs/measurements.md, 2026-12-07)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def read_stop(read: Callable[[int, int], bytes], offset: int) -> StopRecord | None:
    """The stop record of the journal area at `offset` (read(offset, n) reads the pool), or None."""
    head = read(offset + STOP_AT, _STOP.size)
    magic, at_ns, epoch, n = _STOP.unpack(head)
    if magic != STOP_MAGIC:
        return None
    raw = read(offset + STOP_AT + _STOP.size, min(n, STOP_REASON_MAX))
    return StopRecord(at_ns, epoch, raw.decode("utf-8", "replace"))


def stop_record(at_ns: int, epoch: int, reason: str) -> bytes:
    raw = reason.encode()[:STOP_REASON_MAX]
    return _STOP.pack(STOP_MAGIC, at_ns, epoch, len(raw)) + raw


def coverage_bytes(blocks: int, ns_len: int, key_len: int = 32) -> int:
    """The journal area that holds `blocks` one-extent blocks with their CRC32C in one half (what the
    live index needs at a compaction), for names `ns_len` bytes long and keys `key_len` bytes long."""
    record = _REC.size + len(encode_commit("n" * ns_len, bytes(key_len), 1, [(0, 0)], 0))
    order = _REC.size + _ORDER.size
    return HEADER + 2 * (order + blocks * record + _REC.size)


class JournalFull(Exception):
    """The live index does not fit one half of the journal area."""


@dataclass
class Record:
    kind: int
    ns: str
    key: bytes
    nbytes: int = 0
    blocks: list[tuple[int, int]] | None = None
    checksum: int | None = None


def _ended(rec: bytes, at: int, half_size: int) -> bytes:
    """`rec` followed by a zero length where the half has room: a reader stops after it even where
    the bytes beyond are records of this generation left by a rewrite that never finished (an
    interrupted compaction writes the next generation, and so does the next leader's)."""
    return rec + _END if at + len(rec) + _REC.size <= half_size else rec


def _crc(generation: int, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(_U64.pack(generation)))


def encode_commit(
    ns: str, key: bytes, nbytes: int, blocks: list[tuple[int, int]], checksum: int | None = None
) -> bytes:
    raw = ns.encode()
    head = bytes([COMMIT]) + _U16.pack(len(raw)) + raw + _U16.pack(len(key)) + key
    body = head + _U64.pack(nbytes) + _U16.pack(len(blocks)) + b"".join(_BLOCK.pack(s, o) for s, o in blocks)
    if checksum is not None:
        body += _CHECKSUM.pack(CHECKSUM_CRC32C, checksum)
    return body


def encode_order(ways: int, granularity: int) -> bytes:
    return _ORDER.pack(ORDER, 0, 0, ways, granularity)


def same_order(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two (ways, granularity) settings order a block's bytes the same way (one way: by offset)."""
    return a == b or (a[0] == 1 and b[0] == 1)


def encode_remove(ns: str, key: bytes) -> bytes:
    raw = ns.encode()
    return bytes([REMOVE]) + _U16.pack(len(raw)) + raw + _U16.pack(len(key)) + key


def decode(body: bytes) -> Record:
    """Parse a record body whose crc matched; ValueError if it still does not make sense."""
    try:
        kind = body[0]
        if kind == ORDER:
            _kind, _a, _b, ways, granularity = _ORDER.unpack_from(body, 0)
            if ways < 1 or granularity < 1:
                raise ValueError(f"bad ORDER record: ways {ways}, granularity {granularity}")
            return Record(kind, "", b"", granularity, [(ways, granularity)])
        n = _U16.unpack_from(body, 1)[0]
        ns = body[3 : 3 + n].decode()
        pos = 3 + n
        k = _U16.unpack_from(body, pos)[0]
        key = body[pos + 2 : pos + 2 + k]
        pos += 2 + k
        if len(key) != k or kind not in (COMMIT, REMOVE):
            raise ValueError("truncated record")
        if kind == REMOVE:
            return Record(kind, ns, key)
        nbytes = _U64.unpack_from(body, pos)[0]
        count = _U16.unpack_from(body, pos + 8)[0]
        blocks = [_BLOCK.unpack_from(body, pos + 10 + i * 16) for i in range(count)]
        pos += 10 + count * 16
        checksum = None
        if len(body) >= pos + _CHECKSUM.size:
            ck_kind, crc = _CHECKSUM.unpack_from(body, pos)
            if ck_kind != CHECKSUM_CRC32C:
                raise ValueError(f"unknown checksum kind {ck_kind}")
            checksum = crc
        return Record(kind, ns, key, nbytes, blocks, checksum)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"bad journal record: {exc}") from None


class Journal:
    def __init__(self, pool: PoolMapping, offset: int, size: int) -> None:
        self.pool = pool
        self.offset = offset
        self.half_size = (size - HEADER) // 2
        if self.half_size < 4096:
            raise ValueError(f"journal area of {size} bytes is too small")
        self.generation = 0
        self.half = 0
        self.pos = 0
        self.records_written = 0
        self.compactions = 0
        self.order = NO_INTERLEAVE  # what rewrite() records; the keeper sets the allocator's
        self._nhalf = -1  # the half a rewrite in steps is writing (-1: none under way)
        self._ngen = 0
        self._nseed = 0
        self._npos = 0
        self.scanned_to = 0  # where the last scan_half stopped

    def _half_base(self, half: int) -> int:
        return self.offset + HEADER + half * self.half_size

    # --- reading ------------------------------------------------------------------------------
    def state(self) -> tuple[int, int] | None:
        """(generation, active half) from the area's header; None when it holds no journal. Read
        afresh from the pool (invalidated first on a non-coherent pool): a standby follows it."""
        pool = self.pool
        if pool.needs_flush:
            native.flush(pool.buf, self.offset, 64, True)
        if pool.read(self.offset, 8) != MAGIC:
            return None
        state = native.load64(pool.buf, self.offset + 8)
        return state >> 1, state & 1

    def scan(self) -> Iterator[memoryview]:
        """The record bodies of the active half, in order, as views of the pool (no copy; each valid
        until the next); nothing if the area holds no journal. Leaves `pos` at the end of the last."""
        st = self.state()
        if st is None:
            return
        self.generation, self.half = st
        try:
            yield from self.scan_half(self.generation, self.half, 0)
        finally:
            self.pos = self.scanned_to

    def scan_half(self, generation: int, half: int, start: int) -> Iterator[memoryview]:
        """The bodies of `half`'s records of `generation` from byte `start` on: one pass over the
        mapping, each crc checked, stopping at the first record that does not check out (the end, a
        torn write, or an older generation's leftovers); `scanned_to` is where it stopped. On a
        non-coherent pool the half is invalidated a stretch at a time ahead of the reads (`SCAN_FLUSH`)."""
        pool = self.pool
        base = self._half_base(half)
        end = self.half_size
        flush = pool.needs_flush
        flushed = start
        seed = zlib.crc32(_U64.pack(generation))
        crc32 = zlib.crc32
        unpack_rec = _REC.unpack_from
        rec = _REC.size
        view = pool.buf[base : base + end]
        pos = start
        try:
            while pos + rec <= end:
                if flush and flushed < pos + rec:
                    flushed = self._invalidate(base, flushed, pos + rec, end)
                length, crc = unpack_rec(view, pos)
                stop = pos + rec + length
                if length == 0 or stop > end:
                    break
                if flush and flushed < stop:
                    flushed = self._invalidate(base, flushed, stop, end)
                body = view[pos + rec : stop]
                if crc32(body, seed) != crc:
                    break
                yield body
                pos = stop
        finally:
            self.scanned_to = pos
            view.release()

    def _invalidate(self, base: int, flushed: int, need: int, end: int) -> int:
        top = min(end, max(need, flushed + SCAN_FLUSH))
        native.flush(self.pool.buf, base + flushed, top - flushed, True)
        return top

    def read(self) -> Iterator[Record]:
        """Records of the active half, in order; nothing if the area holds no journal."""
        for body in self.scan():
            try:
                rec = decode(bytes(body))
            except ValueError:
                return
            yield rec

    # --- writing ------------------------------------------------------------------------------
    def append(
        self,
        body: bytes,
        live: Callable[[], Iterable[Entry]] | None = None,
        names: dict[int, str] | None = None,
    ) -> None:
        """Append one record; when the half is full, compact the live index (`live()`) into the other half first.
        While a rewrite is under way (`begin_rewrite`) the record goes to both halves: the active one
        stays whole until the switch, and the new one follows every change since the rewrite began."""
        if self.rewriting:
            if self._npos + _REC.size + len(body) > self.half_size:
                raise JournalFull("the live index fills the journal")
            if self.pos + _REC.size + len(body) > self.half_size:
                raise JournalFull("the journal half filled before its rewrite ended")
            self._write(self.half, body)
            rec = _REC.pack(len(body), zlib.crc32(body, self._nseed)) + body
            self.pool.write(self._half_base(self._nhalf) + self._npos, _ended(rec, self._npos, self.half_size))
            self._npos += len(rec)
            return
        if self.pos + _REC.size + len(body) > self.half_size:
            if live is None or names is None:
                raise JournalFull("the journal half is full")
            self.rewrite(live(), names)
            if self.pos + _REC.size + len(body) > self.half_size:
                raise JournalFull("the live index fills the journal")
        self._write(self.half, body)

    def _write(self, half: int, body: bytes) -> None:
        base = self._half_base(half)
        rec = _REC.pack(len(body), _crc(self.generation, body)) + body
        self.pool.write(base + self.pos, _ended(rec, self.pos, self.half_size))
        self.pos += len(rec)
        self.records_written += 1

    def rewrite(self, live: Iterable[Entry], names: dict[int, str]) -> None:
        """Write every live entry into the other half under a new generation, then switch to it (at
        once: a start-up rebuild, or a half that filled with no rewrite under way)."""
        self.begin_rewrite()
        try:
            self.rewrite_more(live, names)
        except BaseException:
            self._nhalf = -1
            raise
        self.finish_rewrite()

    def rewrite_copy(self, spans: bytes, count: int) -> None:
        """The start-up compaction by copy: the `count` live records of the active half that the
        native replay named (`spans`: u64 body offset in the half, u64 length each) written into the
        other half under a new generation, then a switch to it. The bodies are the bytes the index
        was just restored from, so the result is what `rewrite` of the restored index writes."""
        copy = native.journal_copy
        assert copy is not None
        self.begin_rewrite()
        try:
            wrote = copy(
                self.pool.buf,
                self._half_base(self.half),
                self.half_size,
                spans,
                self._half_base(self._nhalf) + self._npos,
                self.half_size - self._npos,
                self._nseed,
                self.pool.needs_flush,
            )
            if wrote < 0:
                raise JournalFull("the live index does not fit one half of the journal area")
            self.pool.sync()
        except BaseException:
            self._nhalf = -1
            raise
        self._npos += wrote
        self.records_written += count
        self.finish_rewrite()

    # A rewrite in steps: begin_rewrite, rewrite_more with a slice of the live entries at a time (the
    # records appended meanwhile go to both halves), finish_rewrite to switch. The state word flips
    # only at the finish, so a crash before it leaves the old half, whole, active.
    @property
    def rewriting(self) -> bool:
        return self._nhalf >= 0

    def begin_rewrite(self) -> None:
        self._nhalf = 1 - self.half
        self._ngen = self.generation + 1
        self._nseed = zlib.crc32(_U64.pack(self._ngen))
        self._npos = 0
        self._heads: dict[int, bytes] = {}  # namespace id -> kind, name (the record's start, same for all its keys)
        body = encode_order(*self.order)
        self._put_new(_REC.pack(len(body), zlib.crc32(body, self._nseed)) + body)

    def rewrite_more(self, live: Iterable[Entry], names: dict[int, str]) -> None:
        """COMMIT records of `live` into the new half, packed and written a few MiB at a time (a
        write per record cost more than the record at millions of entries)."""
        seed = self._nseed
        crc32 = zlib.crc32
        pack_rec, pack_len, pack_one, crc_kind = _REC.pack, _U16.pack, _ONE_CHECKED.pack, CHECKSUM_CRC32C
        heads = self._heads
        limit = self.half_size
        out = bytearray()
        count = 0
        for e in live:
            ns, key = e.key
            head = heads.get(ns)
            if head is None:
                raw = names[ns].encode()
                head = heads[ns] = bytes([COMMIT]) + _U16.pack(len(raw)) + raw
            a = e.alloc
            one = a.single
            if one is not None and e.checksum is not None:  # one pack for the tail of most records
                tail = pack_one(a.nbytes, 1, one[0], one[1], crc_kind, e.checksum)
                body = b"".join((head, pack_len(len(key)), key, tail))
            else:
                blocks = a.blocks
                body = head + _U16.pack(len(key)) + key + _HEAD.pack(a.nbytes, len(blocks))
                body += b"".join([_BLOCK.pack(sz, off) for sz, off in blocks])
                if e.checksum is not None:
                    body += _CHECKSUM.pack(CHECKSUM_CRC32C, e.checksum)
            if self._npos + len(out) + _REC.size + len(body) > limit:
                self._put_new(out)
                raise JournalFull("the live index does not fit one half of the journal area")
            out += pack_rec(len(body), crc32(body, seed))
            out += body
            count += 1
            if len(out) >= REWRITE_CHUNK:
                self._put_new(out)
                out = bytearray()
        self._put_new(out)
        self.records_written += count

    def _put_new(self, data: bytes | bytearray) -> None:
        if data:
            self.pool.write(self._half_base(self._nhalf) + self._npos, data)
            self._npos += len(data)

    def finish_rewrite(self) -> None:
        """Switch to the new half: everything it needs is written."""
        half = self._nhalf
        end = self._npos
        # A zero length after the last record, so a reader stops here even before the crc check.
        if end + _REC.size <= self.half_size:
            self.pool.write(self._half_base(half) + end, bytes(_REC.size))
        self.records_written += 1  # the ORDER record
        if self.pool.read(self.offset, 8) != MAGIC:
            self.pool.write(self.offset, MAGIC)
        native.store64(self.pool.buf, self.offset + 8, self._ngen << 1 | half, self.pool.needs_flush)
        self.half, self.generation, self.pos = half, self._ngen, end
        self._nhalf = -1
        self.compactions += 1


Live = dict[tuple[str, bytes], tuple[int, list[tuple[int, int]], int | None]]


Parsed = tuple[int, str, bytes, int, list[tuple[int, int]], int | None]


def parse(body: memoryview | bytes, names: dict[bytes, str]) -> Parsed:
    """One record body, parsed in place: (kind, namespace, key, nbytes, blocks, checksum); for ORDER
    (ORDER, "", b"", 0, [(ways, granularity)], None). `names` caches one str per namespace name (not
    one per record); a one-extent block (the common case) is read without a loop. ValueError (or
    IndexError, struct.error, UnicodeDecodeError) for a body that does not parse."""
    kind = body[0]
    if kind not in (COMMIT, REMOVE):
        rec = decode(bytes(body))  # ORDER, or a kind this version does not know: ValueError
        assert rec.blocks is not None
        return ORDER, "", b"", 0, rec.blocks, None
    n = body[1] | body[2] << 8
    raw = bytes(body[3 : 3 + n])
    ns = names.get(raw)
    if ns is None:
        ns = names[raw] = raw.decode()
    pos = 3 + n
    k = body[pos] | body[pos + 1] << 8
    key = bytes(body[pos + 2 : pos + 2 + k])
    pos += 2 + k
    if len(key) != k:
        raise ValueError("truncated record")
    if kind == REMOVE:
        return REMOVE, ns, key, 0, [], None
    nbytes, count = _HEAD.unpack_from(body, pos)
    pos += 10
    block = _BLOCK.unpack_from
    blocks = [block(body, pos)] if count == 1 else [block(body, pos + i * 16) for i in range(count)]
    pos += count * 16
    crc = None
    if len(body) >= pos + 6:
        ck_kind, crc = _CHECKSUM.unpack_from(body, pos)
        if ck_kind != CHECKSUM_CRC32C:
            raise ValueError(f"unknown checksum kind {ck_kind}")
    return COMMIT, ns, key, nbytes, blocks, crc


BAD_RECORD = (IndexError, struct.error, UnicodeDecodeError, ValueError)


def replay(journal: Journal) -> tuple[Live, tuple[int, int]]:
    """The live set a journal's active half describes: (namespace, key) -> (nbytes, blocks, checksum),
    and the ORDER it was written in. One pass over the record views (`parse`). A record that does
    not parse ends the replay, as in `read`."""
    live: Live = {}
    names: dict[bytes, str] = {}
    order = NO_INTERLEAVE  # a half without an ORDER record was written before interleave order existed
    for body in journal.scan():
        try:
            kind, ns, key, nbytes, blocks, crc = parse(body, names)
        except BAD_RECORD:
            break
        if kind == COMMIT:
            live[(ns, key)] = (nbytes, blocks, crc)
        elif kind == REMOVE:
            live.pop((ns, key), None)
        else:
            order = blocks[0]
    return live, order


@dataclass
class LiveSet:
    """A journal half's live, checksummed COMMITs as parallel lists, in the order `replay`'s dict holds
    them: item i is (names[ns_ids[i]], keys[i]) -> shapes[i] = (nbytes, blocks), checksums[i].
    `spans` (u64 body offset in the half, u64 length per item) comes with the native replay only: the
    start-up compaction copies those bodies (`Journal.rewrite_copy`)."""

    order: tuple[int, int]
    names: list[str]
    ns_ids: Sequence[int]
    keys: list[bytes]
    shapes: Sequence[tuple[int, list[tuple[int, int]]]]  # a list, or the native replay's PackedShapes
    checksums: list[int]
    unchecked: int  # live COMMITs without a checksum, left out
    spans: bytes | None = None
    odd: int = 0  # blocks of a size class this version no longer has (restored as whole chunks)


def replay_live(journal: Journal) -> LiveSet:
    """The live set of the journal's active half (see `replay`), from the native replay where the helper
    is built: it scans, checks and merges the records without Python objects, at a restart's millions.
    The Python replay gives the same set (tests compare the two on hostile halves), and stays the
    answer where a namespace name is not UTF-8: it says where such a record ends the replay."""
    got = _replay_native(journal)
    if got is not None:
        return got
    records, order = replay(journal)
    numbers: dict[str, int] = {}
    ns_ids: list[int] = []
    keys: list[bytes] = []
    shapes: list[tuple[int, list[tuple[int, int]]]] = []
    checksums: list[int] = []
    for (ns, key), (nbytes, blocks, crc) in records.items():
        if crc is None:
            continue
        ns_ids.append(numbers.setdefault(ns, len(numbers)))
        keys.append(key)
        shapes.append((nbytes, blocks))
        checksums.append(crc)
    return LiveSet(order, list(numbers), ns_ids, keys, shapes, checksums, len(records) - len(keys))


def _replay_native(journal: Journal) -> LiveSet | None:
    run = native.journal_replay
    if run is None:
        return None
    st = journal.state()
    if st is None:
        return LiveSet(NO_INTERLEAVE, [], [], [], [], [], 0, b"")
    generation, half = st
    pool = journal.pool
    seed = zlib.crc32(_U64.pack(generation))
    end, order, raw, ns_ids, keys, one, multi, checksums, spans, unchecked, odd = run(
        pool.buf, journal._half_base(half), journal.half_size, seed, pool.needs_flush, SCAN_FLUSH, CHUNK
    )
    try:
        names = [n.decode() for n in raw]
    except UnicodeDecodeError:
        return None  # the Python replay stops at that record
    journal.generation, journal.half = generation, half
    journal.pos = journal.scanned_to = end
    ids = memoryview(ns_ids).cast("I")
    shapes = PackedShapes(one, multi)
    return LiveSet(order or NO_INTERLEAVE, names, ids, keys, shapes, checksums, unchecked, spans, odd)


# --- the server's use of the journal (restart policy "journal") -----------------------------------
class JournalKeeper:
    """Rebuilds the index from the journal at start, then journals every commit and removal.

    The index calls `committed(entry)` / `removed(entry)` (it holds this object as `index.journal`).
    If the journal overflows, journaling stops and the journal on media is invalidated: a stale
    one could restore blocks whose space was handed out again after it stopped.
    """

    def __init__(
        self, pool: PoolMapping, offset: int, size: int, index: KVIndex, allocator: Allocator, epoch: int = 0
    ) -> None:
        self.pool = pool
        self.offset = offset
        self.index = index
        self.allocator = allocator
        self.journal: Journal | None = Journal(pool, offset, size)
        self.journal.order = (allocator.ways, allocator.granularity) if allocator.ways > 1 else NO_INTERLEAVE
        self.note = ""
        self.restored_entries = 0
        self.unchecked_dropped = 0  # journaled blocks without a CRC32C, not restored
        self.epoch = epoch
        self.stopped = ""  # why journaling stopped ("" while it runs): /readyz fails with it
        # The compaction in steps: the slab's places [walked, walk_end) still to write, of entries
        # older than walk_mark (younger ones reach the new half as they are appended).
        self.walked = self.walk_end = self.walk_mark = 0
        self.room = 0  # free bytes of the active half when it became active: a compaction starts at half of it
        self.previous_stop: StopRecord | None = None  # the previous incarnation's, read at start
        self.warm = False  # took over a warm standby's index (take_over) instead of a rebuild
        self.clock_ns = time.time_ns

    def rebuild(self) -> None:
        """Replay the journal into the (empty) index, compact it, and journal from now on (the
        cyclic GC paused meanwhile: `gc_paused`)."""
        with gc_paused():
            self._rebuild()

    def _rebuild(self) -> None:
        journal = self.journal
        assert journal is not None
        self.previous_stop = read_stop(self.pool.read, self.offset)
        live = replay_live(journal)
        order, keys, shapes, checksums = live.order, live.keys, live.shapes, live.checksums
        # Blocks without a checksum are left out: no reader could verify them, so they are never
        # served and their space stays free.
        unchecked = live.unchecked
        self.unchecked_dropped = unchecked
        if keys and not same_order(order, journal.order):
            # Restoring would rebuild each block's extents in another order than its writer used.
            self.note = (
                f"journal written with software interleave {order[0]} ways x {order[1] >> 20} MiB, the server "
                f"now runs {journal.order[0]} ways x {journal.order[1] >> 20} MiB; started empty"
            )
            keys, shapes, checksums = [], [], []
        try:
            allocs = self.allocator.restore(shapes)
        except ValueError as exc:
            self.note = f"journal inconsistent ({exc}); started empty"
            allocs, keys, checksums = [], [], []
        replayed = len(live.keys)
        del shapes
        live.shapes = []  # what the allocator restored from is garbage now (hundreds of MB at millions)
        live.keys = live.checksums = []
        self.index.restore_columns(live.names, live.ns_ids if keys else [], keys, allocs, checksums)
        self.restored_entries = len(keys)
        del keys, allocs, checksums
        if unchecked and not self.note:
            self.note = f"{unchecked} journaled blocks without a checksum were not restored"
        prev = self.previous_stop
        if prev is not None and not self.note:
            self.note = (
                f"nothing restored: the previous server's journal stopped (epoch {prev.epoch}: {prev.reason}); "
                "started empty"
            )
        try:
            if live.spans is not None and not live.odd and len(self.index.entries) == self.restored_entries == replayed:
                journal.rewrite_copy(live.spans, replayed)  # the bodies just restored, copied as they are
            else:
                journal.rewrite(list(self.index.entries.values()), self.index.ns_names)
        except (JournalFull, OSError, ValueError) as exc:
            self.off(f"{exc}; journaling stopped at start")
            return
        if prev is not None:
            self.pool.write(self.offset + STOP_AT, bytes(_STOP.size))  # our own journal runs: the stop is past
        self.room = journal.half_size - journal.pos
        self.index.journal = self

    def take_over(self, follower: JournalFollower) -> None:
        """Journal on from where a warm standby's follower stopped (mds/journal_follow.py): its index
        is the journal's, so nothing is replayed or rewritten; appends go on at its position."""
        j = self.journal
        assert j is not None and follower.followed is not None
        j.generation, j.half = follower.followed
        j.pos = follower.pos
        self.restored_entries = len(self.index.entries)
        self.unchecked_dropped = follower.unchecked
        self.warm = True
        self.room = j.half_size - j.pos
        self.index.journal = self

    def committed(self, e: Entry) -> None:
        names = self.index.ns_names
        self._append(encode_commit(names[e.key[0]], e.key[1], e.alloc.nbytes, e.alloc.blocks, e.checksum))

    def removed(self, e: Entry) -> None:
        self._append(encode_remove(self.index.ns_names[e.key[0]], e.key[1]))

    def _append(self, body: bytes) -> None:
        j = self.journal
        if j is None:
            return
        index = self.index
        try:
            need = _REC.size + len(body)
            if j.rewriting and j.pos + need > j.half_size:
                # The old half filled before the walk ended (writers outran the steps): end it now.
                while self.journal is not None and j.rewriting:
                    self.compact_step(1 << 30)
                if self.journal is None:
                    return
            elif not j.rewriting and j.half_size - j.pos - need < self.room // 2:
                # Half the room is used: rewrite the live index into the other half in steps from now
                # on, while the other half of the room takes what is appended meanwhile.
                j.begin_rewrite()
                self.walked, self.walk_end, self.walk_mark = 0, len(index.slab), index.id_mark()
            j.append(body, lambda: list(index.entries.values()), index.ns_names)
        except JournalFull as exc:
            self.off(f"{exc}; journaling stopped, the next start will be empty")
        except (OSError, ValueError, BufferError) as exc:  # a write the pool refused
            self.off(f"journal write failed ({exc}); journaling stopped, the next start will be empty")

    @property
    def compacting(self) -> bool:
        return self.journal is not None and self.journal.rewriting

    def compact_step(self, budget: int | None = None) -> int:
        """Write the next `budget` (COMPACT_STEP) places of the slab's live entries into the new half;
        switch to it after the last. How many entries it wrote."""
        j = self.journal
        if j is None or not j.rewriting:
            return 0
        stop = min(self.walked + (budget or COMPACT_STEP), self.walk_end)
        mark = self.walk_mark
        batch = [e for e in self.index.slab[self.walked : stop] if e is not None and e.id < mark]
        try:
            j.rewrite_more(batch, self.index.ns_names)
            self.walked = stop
            if stop >= self.walk_end:
                j.finish_rewrite()
                self.room = j.half_size - j.pos
        except JournalFull as exc:
            self.off(f"{exc}; journaling stopped, the next start will be empty")
        except (OSError, ValueError, BufferError) as exc:
            self.off(f"journal write failed ({exc}); journaling stopped, the next start will be empty")
        return len(batch)

    def off(self, why: str) -> None:
        """Stop journaling, for good in this incarnation: invalidate the journal and say why, on media
        (the stop record) and to /readyz."""
        self.index.journal = None
        self.journal = None
        self.note = why
        self.stopped = why
        try:
            self.pool.write(self.offset, bytes(len(MAGIC)))
            self.pool.write(self.offset + STOP_AT, stop_record(self.clock_ns(), self.epoch, why))
        except (OSError, ValueError, BufferError) as exc:
            self.stopped = f"{why}; the journal could not even be invalidated ({exc})"

    def stats(self) -> dict[str, object]:
        return {
            "active": self.journal is not None,
            "restored_entries": self.restored_entries,
            "warm_takeover": self.warm,
            "unchecked_dropped": self.unchecked_dropped,
            "records_written": self.journal.records_written if self.journal else 0,
            "compactions": self.journal.compactions if self.journal else 0,
            "note": self.note,
            "stopped": self.stopped,
            "previous_stop": self.previous_stop.to_dict() if self.previous_stop else None,
            "half_bytes": self.journal.half_size if self.journal else 0,
            "used_bytes": self.journal.pos if self.journal else 0,
        }
