"""The on-media header: round trip, and every kind of bad bytes becomes an InputError."""

import contextlib
import functools
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from belugactl.errors import InputError
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.pool import header as hdr
from belugactl.pool.header import CLAIM_OFFSET, EPOCH_OFFSET, FIXED_SIZE, PoolHeader, diff
from tests.support.manifests import EXAMPLES, MINIMAL


def _header(path=EXAMPLES / "beluga-rack.yaml", **kwargs) -> PoolHeader:
    m = load_manifest(path)
    return PoolHeader.from_layout(m, resolve_layout(m), created_by="beluga-00", created_time=1_700_000_000, **kwargs)


def test_round_trip():
    h = _header(epoch=7, claim=0xABCDEF)
    data = h.pack()
    assert len(data) == FIXED_SIZE + 64 * 16
    assert PoolHeader.unpack(data) == h
    # the 2 MiB header region read whole is fine too
    assert PoolHeader.unpack(data + bytes(4096)) == h


def test_header_carries_the_layout():
    m = load_manifest(EXAMPLES / "lab.yaml")
    layout = resolve_layout(m)
    h = PoolHeader.from_layout(m, layout, created_by="lab-1", created_time=0)
    assert h.pool_uuid == m.pool.namespace.uuid
    assert h.layout_hash == layout.layout_hash
    assert [(e.name, e.offset, e.size) for e in h.hosts] == [(p.host, p.offset, p.size) for p in layout.partitions]
    assert h.length <= hdr.HEADER_REGION


def test_live_word_offsets_are_fixed_and_aligned():
    assert CLAIM_OFFSET % 64 == 0 and EPOCH_OFFSET % 64 == 0
    assert EPOCH_OFFSET - CLAIM_OFFSET >= 64  # separate cache lines


def test_epoch_and_claim_change_without_breaking_the_crc():
    buf = bytearray(_header().pack())
    hdr.write_epoch(buf, 41)
    hdr.write_claim(buf, 0x1234)
    h = PoolHeader.unpack(buf)
    assert (h.epoch, h.claim) == (41, 0x1234)
    assert hdr.read_epoch(buf) == 41 and hdr.read_claim(buf) == 0x1234
    assert struct.unpack_from("<Q", buf, EPOCH_OFFSET)[0] == 41


def test_every_covered_byte_is_protected_by_the_crc():
    good = _header().pack()
    live = set(range(CLAIM_OFFSET, CLAIM_OFFSET + 64)) | set(range(EPOCH_OFFSET, EPOCH_OFFSET + 64))
    for i in range(len(good)):
        if i in live:
            continue
        bad = bytearray(good)
        bad[i] ^= 0x01
        with pytest.raises(InputError):
            PoolHeader.unpack(bad)


@pytest.mark.parametrize("cut", [0, 1, 8, FIXED_SIZE - 1, FIXED_SIZE, FIXED_SIZE + 64, FIXED_SIZE + 64 * 16 - 1])
def test_truncated_header(cut):
    with pytest.raises(InputError):
        PoolHeader.unpack(_header().pack()[:cut])


def test_blank_pool_says_not_initialized():
    with pytest.raises(InputError) as info:
        PoolHeader.unpack(bytes(4096))
    assert "never initialized" in info.value.what
    assert hdr.is_blank(bytes(4096))


def test_claimed_but_unwritten_pool_names_the_claim():
    buf = bytearray(4096)
    hdr.write_claim(buf, 0xFEED)
    assert not hdr.is_blank(buf)
    with pytest.raises(InputError) as info:
        PoolHeader.unpack(buf)
    assert "0x000000000000feed" in info.value.what


def test_writer_can_store_the_magic_last():
    h = _header()
    body = bytearray(h.pack(include_magic=False))
    with pytest.raises(InputError):
        PoolHeader.unpack(body)
    body[: len(hdr.MAGIC)] = hdr.MAGIC
    assert PoolHeader.unpack(body) == h


def _recrc(buf: bytearray) -> bytearray:
    work = bytearray(buf)
    work[16:20] = bytes(4)
    work[CLAIM_OFFSET : EPOCH_OFFSET + 64] = bytes(EPOCH_OFFSET + 64 - CLAIM_OFFSET)
    struct.pack_into("<I", buf, 16, zlib.crc32(work) & 0xFFFFFFFF)
    return buf


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "words"),
    [
        (0, "8s", b"NOTBELUG", "bad magic"),
        (8, "<I", 99, "format version 99"),
        (20, "<I", 0, "host count 0"),
        (20, "<I", 17, "host count 17"),
        (12, "<I", 12345, "header length"),
        (72, "<Q", 1 << 20, "past the pool size"),  # pool size shrunk below the partitions
        (172, "<I", 1, "reserved"),
        (FIXED_SIZE, "48s", b"\xff\xfe" + bytes(46), "not UTF-8"),
        (FIXED_SIZE, "48s", b"a\0b" + bytes(45), "NUL padded"),
        (96, "48s", bytes(48), "created_by"),
    ],
)
def test_inconsistent_fields_are_input_errors_even_with_a_good_crc(offset, fmt, value, words):
    _assert_refused(_header(), offset, fmt, value, words)


def _assert_refused(header: PoolHeader, offset: int, fmt: str, value: object, words: str) -> None:
    buf = bytearray(header.pack())
    struct.pack_into(fmt, buf, offset, value)
    _recrc(buf)
    with pytest.raises(InputError) as info:
        PoolHeader.unpack(buf)
    assert words in info.value.what


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=0, max_size=2048))
def test_random_bytes_never_leak_other_exceptions(data):
    with contextlib.suppress(InputError):
        PoolHeader.unpack(data)


@functools.cache
def _packed() -> bytes:
    return _header().pack()


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 1407), st.integers(1, 255))
def test_corrupted_valid_header_never_leaks_other_exceptions(index, xor):
    buf = bytearray(_packed())
    buf[index] ^= xor
    _recrc(buf)  # get past the crc to exercise the field checks
    with contextlib.suppress(InputError):
        PoolHeader.unpack(buf)


def test_diff_names_each_differing_field():
    ours = _header(path=EXAMPLES / "lab.yaml")
    m = load_manifest(EXAMPLES / "lab.yaml")
    assert diff(ours, ours) == []
    theirs = PoolHeader.unpack(ours.pack())
    assert diff(ours, theirs) == []
    other_manifest = load_manifest_text(MINIMAL)
    other = PoolHeader.from_layout(other_manifest, resolve_layout(other_manifest), created_by="x", created_time=5)
    fields = {f for f, _, _ in diff(ours, other)}
    assert {"pool_uuid", "layout_hash", "hosts[0].name", "hosts[1].name"} <= fields
    assert "created_by" not in fields and "epoch" not in fields
    assert "created_by" in {f for f, _, _ in diff(ours, other, include_runtime=True)}
    assert m.pool.namespace.uuid in {o for f, o, _ in diff(ours, other) if f == "pool_uuid"}


def test_pool_uuid_without_a_namespace_is_derived_from_the_rack_name():
    text = MINIMAL.replace("  namespace:\n    uuid: 1c3e5a7b-9d2f-4e61-8a0b-c4d6e8f0a2b3\n    name: t\n", "")
    a = hdr.pool_uuid(load_manifest_text(text))
    b = hdr.pool_uuid(load_manifest_text(text.replace("name: t\n", "name: u\n", 1)))
    assert a != b and len(a) == 36


def test_long_created_by_is_cut_to_fit():
    m = load_manifest(EXAMPLES / "lab.yaml")
    name = "ä" * 40  # 80 bytes of UTF-8
    h = PoolHeader.from_layout(m, resolve_layout(m), created_by=name, created_time=0)
    assert name.startswith(h.created_by) and len(h.created_by.encode()) <= 47
    assert PoolHeader.unpack(h.pack()).created_by == h.created_by


def _capacity_header(**kwargs) -> PoolHeader:
    text = (EXAMPLES / "beluga-rack.yaml").read_text().replace(
        "  shared_kv: rest", "  shared_kv: rest\n  capacity: {hosts: 16, rings_per_host: 24}", 1
    )
    m = load_manifest_text(text)
    layout = resolve_layout(m)
    assert layout.format_version == 2
    return PoolHeader.from_layout(m, layout, created_by="beluga-00", created_time=1_700_000_000, **kwargs)


def test_a_capacity_header_round_trips_with_its_membership_words():
    h = _capacity_header(epoch=3)
    h = PoolHeader(**{**h.__dict__, "members_version": 5, "members_epoch": 3})
    data = h.pack()
    assert PoolHeader.unpack(data) == h and struct.unpack_from("<QQ", data, hdr.MEMBERS_OFFSET) == (5, 3)
    assert h.to_dict()["members_version"] == 5 and "members_version" not in _header().to_dict()
    # the membership words are runtime: a manifest's header (version 0) does not differ from it
    assert diff(_capacity_header(), h) == []


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "words"),
    [
        (8, "<I", 3, "format version 3"),
        (352, "<Q", 1, "reserved"),  # past the membership words: still reserved
    ],
)
def test_bad_capacity_header_fields_are_input_errors(offset, fmt, value, words):
    _assert_refused(_capacity_header(), offset, fmt, value, words)


def test_a_format_1_header_with_membership_words_is_refused():
    _assert_refused(_header(), hdr.MEMBERS_OFFSET, "<Q", 1, "reserved")


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 1407), st.integers(1, 255))
def test_corrupted_capacity_header_never_leaks_other_exceptions(index, xor):
    buf = bytearray(_capacity_packed())
    buf[index] ^= xor
    _recrc(buf)
    with contextlib.suppress(InputError):
        PoolHeader.unpack(buf)


@functools.cache
def _capacity_packed() -> bytes:
    return _capacity_header().pack()
