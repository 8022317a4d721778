"""The one-call load (`load_blocks_checked`): a pool hit's copy, its checksum check and the no-wait
release of its leases in one native call, with no Python between the copy and the release. The copy
must put the same bytes where `gather_blocks_crc32c` puts them; only blocks whose CRC differs from a
known one are reported; the release goes out exactly as `rpc_release_nowait` sends it, and only
while the leases' deadline has not passed; bad arguments raise before a byte moves; and against a
real server the client's `release_with_copy` / `CopyRelease.done` pair gives the leases back."""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import HEADER, MAGIC, REQ_READY, Op
from tests.dataplane.test_release_nowait_native import MAXP, SLOT, _client_on_ring, _held, _ring, _slots
from tests.support.blocks import zeros_crc

pytestmark = pytest.mark.native

PIECE, LAYERS, BLOCKS = 512, 3, 6


def _layout() -> tuple[bytearray, array]:
    """Tensors: LAYERS pieces of PIECE bytes per block, layer after layer (block stride PIECE)."""
    tensors = bytearray(LAYERS * BLOCKS * PIECE)
    template = array("q")
    for layer in range(LAYERS):
        template.extend((layer * BLOCKS * PIECE, PIECE, PIECE))
    return tensors, template


def _pool(nblocks: int) -> bytearray:
    return bytearray(os.urandom(nblocks * LAYERS * PIECE))


def _pairs(ids_and_slots: list[tuple[int, int]]) -> array:
    out = array("q")
    for block_id, slot in ids_and_slots:
        out.extend((block_id, slot * LAYERS * PIECE))
    return out


def _args(**kw) -> tuple:
    """rpc_release_nowait's arguments on a private ring (see test_release_nowait_native)."""
    buf, offs = kw.pop("ring")
    ids = kw.pop("ids")
    per = kw.pop("per", p.release_capacity(MAXP))
    return (buf, offs.tobytes(), kw.pop("seq", 0), 0xBEEF, ids, 0, per, MAXP, False, *kw.pop("fence", ()))


def test_copies_what_gather_copies_and_reports_only_the_blocks_whose_crc_differs() -> None:
    pool = _pool(4)
    pairs = _pairs([(5, 0), (1, 3), (2, 1)])
    want_tensors, template = _layout()
    crcs = native.gather_blocks_crc32c(pool, want_tensors, template, pairs, save=False)
    assert crcs == [native.crc32c(bytes(pool[s * LAYERS * PIECE : (s + 1) * LAYERS * PIECE])) for s in (0, 3, 1)]
    expected = array("q", [crcs[0], crcs[1] ^ 1, -1])  # the second differs, the third is not known
    tensors, _ = _layout()
    bad, released, ns = native.load_blocks_checked(pool, tensors, template, pairs, expected)
    assert tensors == want_tensors
    assert bad == [1] and released is None and ns == 0
    assert native.load_blocks_checked(pool, tensors, template, pairs, array("q", crcs))[0] == []


def test_the_release_goes_out_as_rpc_release_nowait_sends_it_within_the_deadline() -> None:
    pool = _pool(2)
    pairs = _pairs([(0, 0), (3, 1)])
    template = _layout()[1]
    expected = array("q", [-1, -1])
    ids = array("Q", range(1, 60))
    per = p.release_capacity(MAXP)
    one_call_ring, plain_ring = _ring(), _ring()
    tensors = _layout()[0]
    bad, counts, ns = native.load_blocks_checked(
        pool, tensors, template, pairs, expected, False, _args(ring=one_call_ring, ids=ids, seq=9), time.monotonic() + 5
    )
    assert bad == [] and ns > 0
    plain = native._native.rpc_release_nowait(*_args(ring=plain_ring, ids=ids, seq=9))
    assert counts == plain == [per, per, 59 - 2 * per]
    assert one_call_ring[0] == plain_ring[0]  # the slots, byte for byte
    heads = [h for h, _ in _slots(one_call_ring[0], 9, 3)]
    assert [h[:5] for h in heads] == [(REQ_READY, 9 + i, MAGIC, 0xBEEF, Op.RELEASE) for i in range(3)]

    # Past the deadline (the copy outlived the leases' certain life): copied, nothing sent.
    late_ring, late_tensors = _ring(), _layout()[0]
    bad, result, ns = native.load_blocks_checked(
        pool, late_tensors, template, pairs, expected, False, _args(ring=late_ring, ids=ids), time.monotonic() - 0.001
    )
    assert result is None and ns == 0 and not any(late_ring[0])
    assert late_tensors == tensors


def test_a_moved_epoch_sends_nothing_and_a_busy_slot_stops_the_sending() -> None:
    pool, template = _pool(1), _layout()[1]
    pairs, expected = _pairs([(0, 0)]), array("q", [-1])
    ring = _ring()
    epoch_off = SLOT * 7
    ring[0][epoch_off : epoch_off + 8] = (41).to_bytes(8, "little")
    tensors = _layout()[0]
    _, result, _ = native.load_blocks_checked(
        pool, tensors, template, pairs, expected, False,
        _args(ring=ring, ids=[1, 2], fence=(epoch_off, 40)), time.monotonic() + 5,
    )  # fmt: skip
    assert result == (-1, []) and not any(ring[0][:epoch_off])
    assert tensors[:PIECE] == pool[:PIECE]  # the copy itself happened: the caller decides what it is worth
    ring = _ring()
    HEADER.pack_into(ring[0], 1 * SLOT, REQ_READY, 99, MAGIC, 1, Op.PING, 0, 0)  # an abandoned request in slot 1
    _, result, _ = native.load_blocks_checked(
        pool, _layout()[0], template, pairs, expected, False, _args(ring=ring, ids=list(range(1, 10)), per=4),
        time.monotonic() + 5,
    )  # fmt: skip
    assert result == (-2, [4])


@pytest.mark.parametrize(
    "what",
    ["expected-too-short", "block-outside-pool", "block-id-outside-tensors", "release-not-a-tuple",
     "release-per-message-0", "release-ids-not-integers", "release-past-the-ring"],
)  # fmt: skip
def test_bad_arguments_raise_before_a_byte_moves(what: str) -> None:
    pool, template = _pool(2), _layout()[1]
    pairs, expected = _pairs([(0, 0), (1, 1)]), array("q", [-1, -1])
    ring = _ring()
    release: object = _args(ring=ring, ids=[1, 2])
    if what == "expected-too-short":
        expected = array("q", [-1])
    elif what == "block-outside-pool":
        pairs = _pairs([(0, 0), (1, 2)])
    elif what == "block-id-outside-tensors":
        pairs = _pairs([(0, 0), (BLOCKS, 1)])
    elif what == "release-not-a-tuple":
        release = list(release)
    elif what == "release-per-message-0":
        release = _args(ring=ring, ids=[1, 2], per=0)
    elif what == "release-ids-not-integers":
        release = _args(ring=ring, ids=[1, "2"])
    else:
        release = (*release[:7], SLOT, *release[8:])  # a payload that would run past the ring's slots
    tensors = _layout()[0]
    with pytest.raises((ValueError, TypeError)):
        native.load_blocks_checked(pool, tensors, template, pairs, expected, False, release, time.monotonic() + 5)
    assert not any(tensors) and not any(ring[0])


def test_a_copy_release_gives_the_leases_back_to_a_real_server(pool_path: Path) -> None:
    with _client_on_ring(pool_path) as (_pool_map, c, st):
        keys = [bytes([i]) * 32 for i in range(30)]
        for k in keys:
            c.commit(c.reserve("r", k, 4096).token, zeros_crc(4096))
        leases = array("Q", [loc[1] for loc in c.get_many_tuples("r", keys)])
        assert _held(st, 30) == 30
        src, template = _pool(1), _layout()[1]
        pairs, expected = _pairs([(2, 0)]), array("q", [-1])

        # Too late: nothing sent, the client's ring untouched, and the usual release still works.
        seq, sent = c.transport._seq, c.messages
        release = c.release_with_copy(leases)
        assert release is not None
        # Booked as sent before the copy (so nothing is left to do after it) ...
        assert c.transport._seq == seq + release.messages and c.replies_pending == release.messages
        _, result, _ = native.load_blocks_checked(
            src, _layout()[0], template, pairs, expected, False, release.args, time.monotonic() - 1
        )
        # ... and given back when nothing went out.
        assert release.done(result) is False
        assert c.transport._seq == seq and c.replies_pending == 0 and c.transport.pending == 0 and c.messages == sent

        release = c.release_with_copy(leases)
        _, result, _ = native.load_blocks_checked(
            src, _layout()[0], template, pairs, expected, False, release.args, time.monotonic() + 5
        )
        assert release.done(result) is True
        assert c.replies_pending == c.messages - sent == len(result) >= 1 and c.transport._seq == seq + len(result)
        c.collect_replies()
        assert c.nowait_leases_ended == 0 and c.nowait_refused == 0
        assert _held(st, 0) == 0
        assert all(loc is not None for loc in c.get_many_tuples("r", keys))  # the ring is in step


def test_a_copy_release_that_is_fenced_or_stopped_gives_back_what_it_booked(pool_path: Path) -> None:
    from belugactl.dataplane.metadata_errors import MetadataUnavailable, StaleEpoch

    src, template = _pool(1), _layout()[1]
    pairs, expected = _pairs([(0, 0)]), array("q", [-1])
    with _client_on_ring(pool_path) as (pool, c, _st):
        t = c.transport
        seq, sent = t._seq, c.messages
        t.fence_epoch = c.epoch + 1  # as if the server restarted after this client joined
        release = c.release_with_copy(array("Q", [1, 2, 3]))
        _, result, _ = native.load_blocks_checked(
            src, _layout()[0], template, pairs, expected, False, release.args, time.monotonic() + 5
        )
        assert result == (-1, [])
        with pytest.raises(StaleEpoch):
            release.done(result)
        assert t._seq == seq and t.pending == 0 and c.replies_pending == 0 and c.messages == sent

    with _client_on_ring(pool_path) as (pool, c, _st):
        t = c.transport
        per = p.release_capacity(t.max_payload)
        seq = t._seq
        busy = t._offsets[(seq + 1) % t.slots_per_ring]  # an abandoned request in the second slot
        pool.buf[busy : busy + 8] = REQ_READY.to_bytes(8, "little")
        release = c.release_with_copy(array("Q", range(1, per + 3)))  # two messages
        assert release.messages == 2
        _, result, _ = native.load_blocks_checked(
            src, _layout()[0], template, pairs, expected, False, release.args, time.monotonic() + 5
        )
        assert result == (-2, [per])
        with pytest.raises(MetadataUnavailable):
            release.done(result)
        assert t.broken and t._seq == seq + 1 and t.pending == 1  # the first went out; its reply is awaited
