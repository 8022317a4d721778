"""Every extent a reply names lies in the shared KV area the client read from the pool header:
the GET_MANY decoders (native and Python) refuse one outside it, before any byte is read."""

from __future__ import annotations

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.rpc import protocol as p

AREA = (4 << 20, 12 << 20)


def _reply(*items: bytes) -> bytes:
    return p.encode_many_reply(list(items))


INSIDE = _reply(
    p.encode_get_many_item(5, 8192, [(AREA[0], 4096), (AREA[1] - 4096, 4096)], 7),
    p.encode_get_many_item(0, 0, [(0, 4096)]),  # absent: its extents (if any) are never used
)
OUTSIDE = {
    "over the header": [(0, 4096)],
    "straddling the start": [(AREA[0] - 64, 128)],
    "straddling the end": [(AREA[1] - 64, 128)],
    "wrapping past 2**64": [(AREA[0], (1 << 64) - 1)],
    "second extent outside": [(AREA[0], 4096), (AREA[1], 4096)],
}


@pytest.mark.parametrize("where", list(OUTSIDE))
def test_python_decoders_refuse_an_extent_outside_the_area(where: str) -> None:
    bad = _reply(
        p.encode_get_many_item(5, 4096, [(AREA[0], 4096)], 1), p.encode_get_many_item(6, 4096, OUTSIDE[where], 1)
    )
    assert len(p.decode_get_many_reply_ex(bad)) == 2  # without an area: no bound
    with pytest.raises(p.ProtocolError, match="outside the shared KV area"):
        p.decode_get_many_reply_ex(bad, AREA)
    assert p.extents_outside(OUTSIDE[where], AREA) is not None
    assert [loc[2] for loc in p.decode_get_many_reply_ex(INSIDE, AREA)] == [
        [(AREA[0], 4096), (AREA[1] - 4096, 4096)],
        [(0, 4096)],
    ]


@pytest.mark.native
@pytest.mark.parametrize("where", list(OUTSIDE))
def test_the_native_decoder_refuses_what_the_python_one_refuses(where: str) -> None:
    decode = native._native.get_many_decode
    bad = _reply(
        p.encode_get_many_item(5, 4096, [(AREA[0], 4096)], 1), p.encode_get_many_item(6, 4096, OUTSIDE[where], 1)
    )
    assert len(decode(bad)) == 2  # the old call, no area: no bound (as the Python decoder)
    with pytest.raises(ValueError, match="outside the shared KV area"):
        decode(bad, *AREA)
    with pytest.raises(p.ProtocolError, match="outside the shared KV area"):
        p.decode_get_many_tuples(bad, AREA)
    assert decode(INSIDE, *AREA) == [([(AREA[0], 4096), (AREA[1] - 4096, 4096)], 5, 8192, 7), None]
