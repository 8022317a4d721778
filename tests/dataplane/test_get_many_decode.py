"""The GET_MANY reply decoded straight into location tuples: the C decoder (`get_many_decode`) and
the Python one agree on every valid reply, and refuse the same malformed ones (a hostile server's
bytes never become a location)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from belugactl.dataplane import native
from belugactl.dataplane.rpc import protocol as p

pytestmark = pytest.mark.native

U64 = st.integers(min_value=0, max_value=2**64 - 1)
ITEMS = st.lists(
    st.tuples(
        st.one_of(st.just(0), U64),  # lease (0: absent)
        U64,  # nbytes
        st.lists(st.tuples(U64, U64), max_size=4),  # extents
        st.one_of(st.none(), st.integers(min_value=0, max_value=2**32 - 1)),  # checksum
    ),
    max_size=40,
)


def _reply(items) -> bytes:  # noqa: ANN001
    return p.encode_many_reply([p.encode_get_many_item(lease, n, ext, crc) for lease, n, ext, crc in items])


def _python(data: bytes):  # noqa: ANN202
    return [
        None if not lease else (extents, lease, nbytes, checksum)
        for lease, nbytes, extents, checksum in p.decode_get_many_reply_ex(data)
    ]


@settings(max_examples=300, deadline=None)
@given(ITEMS)
def test_c_and_python_decode_every_valid_reply_alike(items) -> None:  # noqa: ANN001
    data = _reply(items)
    got = p.decode_get_many_tuples(data)
    assert got == _python(data)
    for (lease, nbytes, extents, checksum), loc in zip(items, got, strict=True):
        assert loc is None if not lease else loc == ([tuple(e) for e in extents], lease, nbytes, checksum)


def test_every_truncation_is_refused_by_both() -> None:
    data = _reply([(7, 4096, [(1 << 21, 4096), (3 << 21, 8)], 0xDEADBEEF), (0, 0, [], None), (9, 1, [(0, 1)], None)])
    assert len(p.decode_get_many_tuples(data)) == 3
    for cut in range(len(data)):
        with pytest.raises(p.ProtocolError):
            p.decode_get_many_tuples(data[:cut])
        with pytest.raises(p.ProtocolError):
            p.decode_get_many_reply_ex(data[:cut])


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("<HH", 65535, 0),  # a count of blocks far past the reply
        struct.pack("<HH", 1, 0) + struct.pack("<QQHHI", 5, 64, 65535, 0, 0),  # an extent count past it
        struct.pack("<HH", 1, 0) + struct.pack("<QQHHI", 5, 64, 0, 2, 0),  # an unknown checksum kind
        struct.pack("<HH", 1, 0) + struct.pack("<QQHHI", 0, 64, 0, 7, 0),  # the same on an absent block
    ],
    ids=["count", "extents", "checksum-kind", "absent-checksum-kind"],
)
def test_hostile_replies_are_refused_by_both(data: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_get_many_tuples(data)
    with pytest.raises(p.ProtocolError):
        _python(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_is_decoded_alike_or_refused_by_both(data: bytes) -> None:
    try:
        want = _python(data)
    except p.ProtocolError:
        with pytest.raises(p.ProtocolError):
            p.decode_get_many_tuples(data)
        return
    assert p.decode_get_many_tuples(data) == want


def test_without_the_helper_the_python_decoder_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _reply([(3, 64, [(4096, 64)], 11), (0, 0, [], None)])
    want = p.decode_get_many_tuples(data)
    monkeypatch.setattr(native, "_native", None)
    assert p.decode_get_many_tuples(data) == want == [([(4096, 64)], 3, 64, 11), None]
