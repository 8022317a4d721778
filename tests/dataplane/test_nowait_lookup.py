"""A lookup sent now and answered later (`start_lookup` / `finish_lookup`, nowait.py; the native
`rpc_get_many_start` / `rpc_get_many_finish`): the vLLM scheduler starts a request's lookup when the
request arrives and finishes it when it schedules it.

Against a real server it must answer exactly what `get_many_tuples` answers, whatever is sent in
between (no-wait releases, other lookups, ordinary requests, which take the answer first and keep
it). Against a hostile one it fails as `get_many_tuples` fails: a malformed payload is refused with
the ring still in step, a malformed slot breaks the ring, and no caller ever gets a location that
the reply did not carry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane.client import KVIndexClient, PendingLookup
from belugactl.dataplane.metadata_errors import MetadataUnavailable, RequestRejected
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc import transport_cxl
from belugactl.dataplane.rpc.protocol import Op
from belugactl.dataplane.rpc.transport_tcp import TcpTransport
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_batched_puts import RACK_64
from tests.dataplane.test_call_many import ServerThread, serve_pool
from tests.dataplane.test_get_many_native import (  # noqa: F401 - `hostile` is a fixture
    KEYS,
    KV,
    NS,
    _bad_payloads,
    _client,
    _good,
    _hostile,
    _prefix_then_rest,
    hostile,
)

pytestmark = pytest.mark.native


def _demo_rings(tmp_path: Path) -> PoolMapping:
    """A pool whose rings are the CPU demo's (64 slots of 4 KiB): a 125-key lookup is 2 messages."""
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(RACK_64.replace("slot_size: 256B", "slot_size: 4KiB"))
    return PoolMapping.open(create_file_pool(tmp_path / "pool.bin", manifest))


@pytest.fixture(params=[False, True], ids=["flush-off", "flush-on"])
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[PoolMapping, ServerThread]]:
    yield from serve_pool(_demo_rings(tmp_path), flush=request.param)


def _commit(writer: KVIndexClient, keys: list[bytes], present: set[int]) -> None:
    for i in sorted(present):
        writer.commit(writer.reserve("m", keys[i], 4096 + i).token, checksum=i)


def _strip(locs: list) -> list:
    """Locations without their lease ids (each lookup gets leases of its own)."""
    return [None if loc is None else (loc[0], loc[2], loc[3]) for loc in locs]


@pytest.mark.parametrize("fast", [True, False], ids=["native-server", "python-server"])
def test_a_started_lookup_answers_what_an_immediate_one_answers(tmp_path: Path, fast: bool) -> None:
    pool = _demo_rings(tmp_path)
    st = ServerThread(pool, fast_path=fast)
    try:
        writer = _client(pool, 1)
        keys = [bytes([i]) * 32 for i in range(125)]
        present = set(range(0, 125, 3)) | set(range(40))
        _commit(writer, keys, present)
        reader = _client(pool, 2)
        want = reader.get_many_tuples("m", keys)
        pending = reader.start_lookup("m", keys)
        assert isinstance(pending, PendingLookup)
        assert reader.transport.pending == -(-125 // pending.per_call)  # sent, not taken
        trips = reader.round_trips
        got = reader.finish_lookup(pending)
        assert reader.round_trips - trips == 1 and reader.transport.pending == 0
        assert _strip(got) == _strip(want)
        assert [i for i, loc in enumerate(got) if loc is not None] == sorted(present)
        leases = [loc[1] for loc in got if loc] + [loc[1] for loc in want if loc]
        assert len(set(leases)) == 2 * len(present)  # every block its own, live lease
        assert reader.release(leases) == len(leases)
        with pytest.raises(ValueError, match="taken already"):
            reader.finish_lookup(pending)
    finally:
        st.close()
        pool.close()


def test_requests_sent_in_between_take_the_answer_first_and_keep_it(served) -> None:
    pool, _st = served
    writer = _client(pool, 1)
    keys = [bytes([100 + i]) * 32 for i in range(60)]
    _commit(writer, keys, set(range(25)))
    c = _client(pool, 3)
    first = c.start_lookup("m", keys)
    held = c.get_many_tuples("m", keys[:3])  # an ordinary request: takes `first`'s replies before its own
    assert first is not None and first.reply is not None and c.transport.pending == 0
    assert c.release_nowait([loc[1] for loc in held if loc])  # a no-wait release between two lookups
    second = c.start_lookup("m", keys[10:])
    third = c.start_lookup("m", keys[:5])
    assert second is not None and third is not None
    # Taken out of order: the third waits for the second (and the release) and keeps the second's.
    got3 = c.finish_lookup(third)
    assert second.reply is not None and c.transport.pending == 0
    got2, got1 = c.finish_lookup(second), c.finish_lookup(first)
    assert [loc is not None for loc in got1] == [i < 25 for i in range(60)]
    assert [loc is not None for loc in got2] == [i < 15 for i in range(50)]
    assert [loc is not None for loc in got3] == [True] * 5
    assert c.nowait_refused == 0 and c.nowait_leases_ended == 0
    leases = [loc[1] for got in (got1, got2, got3) for loc in got if loc]
    assert c.release(leases) == len(leases) == 25 + 15 + 5
    again = c.get_many_tuples("m", keys[:1])  # the ring is in step: the next request gets its own answer
    assert again[0] is not None and c.release([again[0][1]]) == 1


def test_a_full_ring_sends_nothing_and_says_so(served) -> None:
    pool, _st = served
    c = _client(pool, 2)
    keys = [bytes([7]) * 32] * 3
    started = []
    while (t := c.start_lookup("m", keys)) is not None:
        started.append(t)
        assert len(started) <= c.transport.max_inflight
    assert len(started) == c.transport.max_inflight  # one message each: every slot in flight
    assert c.transport.pending == c.transport.max_inflight and not c.transport.broken
    assert all(c.finish_lookup(t) == [None] * 3 for t in reversed(started))
    assert c.transport.pending == 0


def test_keys_of_several_lengths_are_not_sent(served) -> None:
    pool, _st = served
    c = _client(pool, 2)
    c._ns_id("m")
    assert c.start_lookup("m", [b"a" * 32, b"b" * 16]) is None
    assert c.start_lookup("m", []) is None
    assert c.transport.pending == 0 and not c.transport.broken


def test_a_reconnect_voids_what_was_started_and_no_client_takes_anothers(served) -> None:
    pool, _st = served
    c, other = _client(pool, 2), _client(pool, 3)
    pending = c.start_lookup("m", [bytes([9]) * 32])
    assert pending is not None
    with pytest.raises(ValueError, match="not started by this client"):
        other.finish_lookup(pending)
    c.transport.broken = True  # as after a timeout: the next request reconnects
    c.ping(b"x")
    with pytest.raises(MetadataUnavailable):
        c.finish_lookup(pending)
    assert c.transport.pending == 0 and c.replies_pending == 0
    assert c.finish_lookup(c.start_lookup("m", [bytes([9]) * 32])) == [None]


def test_a_malformed_slot_breaks_the_ring_and_the_lookup_gets_nothing(pool_path) -> None:
    import threading

    from tests.dataplane.test_call_many import _hostile_server

    pool = PoolMapping.open(pool_path)
    stop = threading.Event()
    thread = _hostile_server(pool, 2, lambda seq, pl: (seq + 1, len(pl), pl), stop)  # the wrong sequence
    try:
        c = KVIndexClient(transport_cxl.CxlTransport(pool, 2), address="cxl://test#2", client_id=2, timeout_s=2.0)
        c._ns["m"] = 7
        pending = c.start_lookup("m", KEYS)
        assert pending is not None
        with pytest.raises(MetadataUnavailable):
            c.finish_lookup(pending)
        assert c.transport.broken and pending.reply is None
    finally:
        stop.set()
        thread.join()
        pool.close()


def test_tcp_cannot_start_a_lookup_and_says_so() -> None:
    assert TcpTransport.can_start_lookups is False  # as the base class declares

    class NoNowait:  # a transport that cannot (TCP): the client must not pretend
        pool = None
        can_start_lookups = False

    c = KVIndexClient(NoNowait(), address="tcp://test", client_id=1, timeout_s=1.0)  # type: ignore[arg-type]
    assert c.start_lookup("m", [b"k" * 32]) is None


@pytest.mark.parametrize("hostile", [_good], indirect=True, ids=["well-formed"])
def test_a_started_lookup_from_a_hand_written_server(hostile) -> None:  # noqa: F811
    c, seen = hostile
    per = p.get_many_capacity(c.transport.max_payload, 32)
    pending = c.start_lookup("m", KEYS)
    got = c.finish_lookup(pending)
    assert seen[0] == -(-len(KEYS) // per)
    want = [([(KV + j % per * 4096, 4096)], 1000 * (j // per + 1) + j % per + 1, 4096, j % per) for j in range(30)]
    assert got == want


@pytest.mark.parametrize("hostile", [_prefix_then_rest], indirect=True, ids=["prefix"])
def test_keys_a_late_reply_left_out_are_asked_again(hostile) -> None:  # noqa: F811
    c, seen = hostile
    per = p.get_many_capacity(c.transport.max_payload, 32)
    messages = -(-len(KEYS) // per)
    got = c.finish_lookup(c.start_lookup("m", KEYS))
    assert seen[0] == messages + 1
    leases = [loc[1] for loc in got]
    assert leases[per - 2 : per] == [1000 * (messages + 1) + 1, 1000 * (messages + 1) + 2]
    assert None not in got


@pytest.mark.parametrize(("body", "error"), _bad_payloads())
def test_a_malformed_late_reply_is_refused_and_the_ring_stays_in_step(pool_path, body, error) -> None:
    for c, _seen in _hostile(pool_path, body):
        pending = c.start_lookup("m", KEYS)
        with pytest.raises((error, p.ProtocolError)):
            c.finish_lookup(pending)
        assert not c.transport.broken and c.transport.pending == 0
        assert c.transport.call(Op.PING, 0, b"next", NS)[2] == b"next"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(lambda nth, pl: b"\x00" * 10_000_000, id="reply-larger-than-the-slot"),
    ],
)
def test_a_reply_cut_at_the_slot_is_refused(pool_path, body) -> None:
    for c, _seen in _hostile(pool_path, body):
        with pytest.raises((RequestRejected, p.ProtocolError)):
            c.finish_lookup(c.start_lookup("m", KEYS))
        assert not c.transport.broken
