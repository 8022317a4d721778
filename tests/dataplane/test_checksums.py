"""CRC32C of KV blocks: the native kernels against known vectors and the Python fallback, the wire
and journal fields that carry a writer's checksum, and a reader's verified copy."""

from __future__ import annotations

import array
import os
import random
import struct
import subprocess
import sys

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import BlockLocation, copy_verified
from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import KVIndex
from belugactl.dataplane.mds.journal import decode, encode_commit
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.metadata_errors import CorruptBlock
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op, ProtocolError
from tests.dataplane.conftest import native_param

# RFC 3720 (iSCSI) appendix B.4 and the usual check value.
VECTORS = [
    (b"", 0),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize("impl", [pytest.param(native._py_crc32c, id="python"), native_param(id="native")])
def test_known_vectors(impl) -> None:
    fn = impl if callable(impl) else impl["crc32c"]
    for data, want in VECTORS:
        assert fn(data) == want, data
    # Chained like zlib.crc32: the CRC of a || b from the CRC of a.
    assert fn(b"6789", 0, -1, fn(b"12345")) == 0xE3069283


@pytest.mark.native
def test_native_matches_python_for_every_length_and_offset() -> None:
    rng = random.Random(11)
    buf = bytes(rng.getrandbits(8) for _ in range(4096))
    for n in range(301):
        for off in (0, 1, 3, 7):
            want = native._py_crc32c(buf, off, n)
            assert native._native.crc32c(buf, off, n) == want, (n, off)
            dst = bytearray(n + 9)
            assert native._native.copy_crc32c(dst, 5, buf, off, n) == want
            assert bytes(dst[5 : 5 + n]) == buf[off : off + n]


@pytest.mark.native
@pytest.mark.parametrize("n", [3 * 512 - 1, 3 * 512, 3 * 4096 + 13, 3 * 32768 + 4100, 300_001])
def test_native_three_lane_lengths_and_nontemporal_copy(n) -> None:
    buf = os.urandom(n + 8)
    want = native._py_crc32c(buf, 3, n)
    assert native._native.crc32c(buf, 3, n) == want
    for nt in (False, True):
        dst = bytearray(n + 16)
        assert native._native.copy_crc32c(dst, 1, buf, 3, n, 0, nt) == want
        assert bytes(dst[1 : 1 + n]) == buf[3 : 3 + n]


@pytest.mark.native
def test_table_kernel_is_used_without_sse42_and_agrees() -> None:
    code = (
        "from belugactl.dataplane import native as n; import os; b = os.urandom(200003); "
        "assert n.CRC32C_KERNEL == 'table', n.CRC32C_KERNEL; "
        "assert n.crc32c(b, 1) == n._py_crc32c(b, 1); print('ok')"
    )
    env = {**os.environ, "BELUGACTL_NATIVE_SSE42": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)  # noqa: S603
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize(
    "impl",
    [pytest.param((native._py_crc32c, native._py_copy_crc32c), id="python"), native_param(id="native")],
)
def test_bounds_are_checked_before_anything_is_read_or_written(impl) -> None:
    crc, copy = impl if isinstance(impl, tuple) else (impl["crc32c"], impl["copy_crc32c"])
    src, dst = bytes(100), bytearray(100)
    for args in ((src, -1, 5), (src, 0, 101), (src, 99, 2)):
        with pytest.raises(ValueError):
            crc(*args)
    for doff, soff, n in ((0, 0, 101), (-1, 0, 5), (96, 0, 5), (0, 96, 5), (0, 0, -1)):
        with pytest.raises(ValueError):
            copy(dst, doff, src, soff, n)
    with pytest.raises((ValueError, OverflowError)):
        crc(src, 0, 10, 1 << 32)
    assert dst == bytearray(100)


@pytest.mark.parametrize(
    "impl", [pytest.param(native._py_gather_blocks_crc32c, id="python"), native_param(id="native")]
)
def test_gather_blocks_crc_both_ways(impl) -> None:
    fn = impl if callable(impl) else impl["gather_blocks_crc32c"]
    tensors = bytearray(os.urandom(12 * 1000))
    template = array.array("q", [0, 1000, 300, 4000, 1000, 200])  # two pieces a block, 500 bytes
    pool = bytearray(4096)
    blocks = array.array("q", [2, 0, 5, 1000])
    crcs = fn(pool, tensors, template, blocks, True)
    for (block, off), crc in zip([(2, 0), (5, 1000)], crcs, strict=True):
        want = bytes(
            tensors[block * 1000 : block * 1000 + 300] + tensors[4000 + block * 1000 : 4000 + block * 1000 + 200]
        )
        assert bytes(pool[off : off + 500]) == want and crc == native._py_crc32c(want)
    back = bytearray(len(tensors))
    assert fn(pool, back, template, blocks, False) == crcs
    assert back[2000:2300] == tensors[2000:2300]
    with pytest.raises(ValueError):
        fn(pool, tensors, template, array.array("q", [8, 0]), True)  # block 8's second piece is outside
    with pytest.raises(ValueError):
        fn(pool, tensors, template, array.array("q", [0, 3700]), True)  # outside the pool


def test_extents_crc_is_the_crc_of_the_block_in_extent_order() -> None:
    pool = bytearray(os.urandom(10_000))
    extents = [(5000, 3000), (100, 4000)]
    assert native.extents_crc32c(pool, extents, 5000) == native.crc32c(bytes(pool[5000:8000] + pool[100:2100]))
    with pytest.raises(ValueError):
        native.extents_crc32c(pool, extents, 8000)


def test_wire_codecs_carry_the_checksum_and_refuse_garbage() -> None:
    assert p.decode_commit(p.encode_u64(77)) == (77, None)  # an old client's token-only frame
    assert len(p.encode_commit(77, 0xE3069283)) == 16
    for missing in (None, "crc", True):
        with pytest.raises(ValueError, match="CRC32C"):
            p.encode_commit(77, missing)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="CRC32C"):
            p.encode_commit_many([(77, missing, p.COMMIT_MANY_COMMIT)])  # type: ignore[list-item]
    assert p.decode_commit_many(p.encode_commit_many([(77, None, p.COMMIT_MANY_ABORT)])) == [
        (77, None, p.COMMIT_MANY_ABORT)
    ]  # an abort carries none
    assert p.decode_commit(p.encode_commit(77, 0xE3069283)) == (77, 0xE3069283)
    assert p.decode_commit(p.encode_commit(77, 0)) == (77, 0)  # a CRC of 0 is a CRC, not "none"
    with pytest.raises(ProtocolError) as exc:
        p.decode_commit(p.encode_u64(77) + (5).to_bytes(4, "little") + (9).to_bytes(4, "little"))
    assert exc.value.code == Code.BAD_ARGS
    with pytest.raises(ProtocolError):
        p.decode_commit(b"\x01" * 7)
    ext = [(4096, 100), (8192, 5)]
    rep = p.encode_get_reply(9, 105, ext, 0xDEADBEEF)
    assert p.decode_get_reply_ex(rep) == (9, 105, ext, 0xDEADBEEF)
    assert p.decode_get_reply(rep) == (9, 105, ext)  # the old decoder reads the fields as padding
    assert p.decode_get_reply_ex(p.encode_get_reply(9, 105, ext)) == (9, 105, ext, None)
    many = struct_many([p.encode_get_many_item(5, 105, ext, 1), p.encode_get_many_item(0, 0, ())])
    assert p.decode_get_many_reply_ex(many) == [(5, 105, ext, 1), (0, 0, [], None)]
    for cut in range(len(many)):
        if cut in (4, 4 + 24 + 32):  # item boundaries: a shorter, still complete list is not an error
            continue
        with pytest.raises(ProtocolError):
            p.decode_get_many_reply_ex(many[:cut])
    with pytest.raises(ValueError):
        p.encode_commit(1, 1 << 32)


def struct_many(items: list[bytes]) -> bytes:
    return len(items).to_bytes(2, "little") + b"\0\0" + b"".join(items)


def test_service_stores_the_commit_checksum_and_returns_it() -> None:
    s = MetadataService(KVIndex(Allocator(CHUNK, 16 * CHUNK)), epoch=7)
    ns = p.decode_u32(s.handle(Op.OPEN_NS, 7, p.encode_name("ns"), 224)[1], "ns")
    for key, checksum in ((b"a" * 32, 0x1234ABCD), (b"b" * 32, 0)):
        code, rep = s.handle(Op.RESERVE, 7, p.encode_reserve(ns, key, 5000), 224)
        token, _ = p.decode_reserve_reply(rep)
        assert s.handle(Op.COMMIT, 7, p.encode_commit(token, checksum), 224) == (0, b"")
        code, rep = s.handle(Op.GET, 7, p.encode_key(ns, key), 224)
        assert code == 0 and p.decode_get_reply_ex(rep)[3] == checksum
    code, rep = s.handle(Op.GET_MANY, 7, p.encode_lookup(ns, [b"a" * 32, b"b" * 32, b"c" * 32]), 512)
    assert [item[3] for item in p.decode_get_many_reply_ex(rep)] == [0x1234ABCD, 0, None]
    assert s.index.counters.commits_checksummed == 2 and s.index.counters.commits == 2
    # A COMMIT with an unknown checksum kind is refused and leaves the reservation open.
    code, rep = s.handle(Op.RESERVE, 7, p.encode_reserve(ns, b"c" * 32, 5000), 224)
    token, _ = p.decode_reserve_reply(rep)
    assert s.handle(Op.COMMIT, 7, p.encode_u64(token) + bytes([1, 0, 0, 0, 2, 0, 0, 0]), 224)[0] == Code.BAD_ARGS
    assert s.handle(Op.COMMIT, 7, p.encode_commit(token, 5), 224) == (0, b"")


def test_service_refuses_a_commit_without_a_checksum_and_counts_it() -> None:
    s = MetadataService(KVIndex(Allocator(CHUNK, 16 * CHUNK)), epoch=7)
    ns = p.decode_u32(s.handle(Op.OPEN_NS, 7, p.encode_name("ns"), 224)[1], "ns")
    tokens = []
    for key in (b"a" * 32, b"b" * 32, b"c" * 32):
        token, _ = p.decode_reserve_reply(s.handle(Op.RESERVE, 7, p.encode_reserve(ns, key, 5000), 224)[1])
        tokens.append(token)
    # An old client's token-only COMMIT, and the 16-byte form with kind 0 ("none").
    assert s.handle(Op.COMMIT, 7, p.encode_u64(tokens[0]), 224) == (Code.NO_CHECKSUM, b"")
    assert s.handle(Op.COMMIT, 7, p.encode_u64(tokens[0]) + bytes(8), 224) == (Code.NO_CHECKSUM, b"")
    # COMMIT_MANY: the item without one is refused, the others done.
    raw = struct.pack("<HHI", 3, 0, 0) + b"".join(
        struct.pack("<QIHH", t, crc, kind, p.COMMIT_MANY_COMMIT)
        for t, crc, kind in ((tokens[1], 0, p.CHECKSUM_NONE), (tokens[2], 7, p.CHECKSUM_CRC32C))
    ) + struct.pack("<QIHH", tokens[0], 0, 0, p.COMMIT_MANY_ABORT)
    code, rep = s.handle(Op.COMMIT_MANY, 7, raw, 224)
    assert code == 0 and p.decode_codes_reply(rep, "r") == [Code.NO_CHECKSUM, Code.OK, Code.OK]
    assert s.errors["NO_CHECKSUM"] == 3 and s.index.counters.commits == 1
    assert s.handle(Op.GET, 7, p.encode_key(ns, b"a" * 32), 224)[0] == Code.NOT_FOUND  # aborted, never visible
    # The refused reservation stays its writer's: it can still commit it with the CRC.
    assert s.handle(Op.COMMIT, 7, p.encode_commit(tokens[1], 9), 224) == (0, b"")


def test_journal_commit_record_keeps_the_checksum_and_reads_old_records() -> None:
    blocks = [(CHUNK, 0), (CHUNK, 4 * CHUNK)]
    rec = decode(encode_commit("m/tp0", b"k" * 32, 3 << 20, blocks, 0xCAFEF00D))
    assert rec.checksum == 0xCAFEF00D and rec.blocks == blocks and rec.nbytes == 3 << 20
    assert decode(encode_commit("m/tp0", b"k" * 32, 3 << 20, blocks)).checksum is None  # an old record
    with pytest.raises(ValueError):
        decode(encode_commit("m/tp0", b"k", 1, blocks)[:-1] + b"\x00" + (7).to_bytes(2, "little") + bytes(4))


def test_journal_restores_checksums_and_refuses_blocks_without_one(pool_path) -> None:
    from tests.dataplane.test_journal import start

    pool, a = start(pool_path)
    ns = a.index.open_namespace("m/tp0")
    for i, checksum in enumerate((0xAB, None, 0)):  # None: a block an older server journaled unchecked
        token, _ = a.index.reserve(ns, bytes([i]) * 32, 10_000)
        a.index.commit(token, checksum=checksum)
    unchecked = a.index.entries[(ns, bytes([1]) * 32)].alloc.extents
    a.close()
    pool.close()
    pool, b = start(pool_path)
    assert "m/tp0" in b.index.namespaces
    assert {k[1][0]: e.checksum for k, e in b.index.entries.items()} == {0: 0xAB, 2: 0}
    stats = b.keeper.stats()
    assert stats["unchecked_dropped"] == 1 and stats["restored_entries"] == 2
    assert "1 journaled blocks without a checksum" in str(stats["note"])
    # Its space is free again: a new block can be given exactly those extents.
    used = {off for e in b.index.entries.values() for off, _n in e.alloc.extents}
    assert not used & {off for off, _n in unchecked}
    b.close()
    pool.close()


def test_copy_verified_copies_good_blocks_and_refuses_bad_ones() -> None:
    pool = bytearray(os.urandom(20_000))
    extents = [(9000, 6000), (0, 4000)]
    good = bytes(pool[9000:15000] + pool[0:4000])
    loc = BlockLocation(extents, 1, 10_000, native.crc32c(good))
    out = bytearray(10_000)
    assert copy_verified(pool, loc, out) == 10_000 and bytes(out) == good
    out[:] = bytes(10_000)
    with pytest.raises(CorruptBlock, match="no checksum"):
        copy_verified(pool, BlockLocation(extents, 1, 10_000, None), out)  # never copied unchecked
    assert bytes(out) == bytes(10_000)  # refused before a byte moved
    copy_verified(pool, loc, out)
    pool[3999] ^= 0x40  # one bit of the last extent
    with pytest.raises(CorruptBlock) as exc:
        copy_verified(pool, loc, out, key=b"\xab")
    assert "ab" in str(exc.value) and exc.value.exit_code  # a typed BelugaError
    with pytest.raises(CorruptBlock):
        copy_verified(pool, BlockLocation([(0, 100)], 1, 10_000, 5), out)  # extents too short
