"""The scheduler's pool-hit lookup in one native call (`rpc_get_many`, `CxlTransport.get_many`):
GET_MANY messages encoded, sent as one burst and decoded in C. It must answer exactly what the
Python path (`call_many` + `decode_get_many_tuples`) answers, against a real server, and fail the
same way against a hostile one: a malformed slot breaks the ring, a malformed payload is refused
with the ring still in step, and no caller ever gets a location the reply did not carry."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from belugactl.dataplane.client import KVIndexClient
from belugactl.dataplane.metadata_errors import MetadataUnavailable, RequestRejected
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc import transport_cxl
from belugactl.dataplane.rpc.protocol import HEADER_SIZE, Op
from belugactl.dataplane.rpc.transport_cxl import CxlTransport
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_call_many import ServerThread, _hostile_server, served  # noqa: F401 - a fixture

pytestmark = pytest.mark.native
NS = 5_000_000_000


def _client(pool: PoolMapping, ring: int) -> KVIndexClient:
    c = KVIndexClient(CxlTransport(pool, ring), address=f"cxl://test#{ring}", client_id=ring, timeout_s=5.0)
    c.reconnect()
    return c


@pytest.mark.parametrize("fast", [True, False], ids=["native-server", "python-server"])
def test_the_one_call_lookup_answers_what_the_python_path_answers(pool_path: Path, fast: bool, monkeypatch) -> None:
    pool = PoolMapping.open(pool_path)
    st = ServerThread(pool, fast_path=fast)
    try:
        writer = _client(pool, 1)
        keys = [bytes([i]) * 32 for i in range(125)]
        present = set(range(0, 125, 3)) | set(range(40))
        for i in sorted(present):
            writer.commit(writer.reserve("m", keys[i], 4096 + i).token, checksum=i)
        reader = _client(pool, 2)
        calls = []
        one_call = reader.transport.get_many
        monkeypatch.setattr(reader.transport, "get_many", lambda *a: calls.append(a) or one_call(*a))
        reader._ns_id("m")
        sent = reader.messages
        got = reader.get_many_tuples("m", keys)
        assert len(calls) == 1 and reader.messages - sent == -(-125 // calls[0][3])  # one native call
        monkeypatch.setattr(transport_cxl, "_rpc_get_many", None)
        want = reader.get_many_tuples("m", keys)
        strip = [None if loc is None else (loc[0], loc[2], loc[3]) for loc in got]
        assert strip == [None if loc is None else (loc[0], loc[2], loc[3]) for loc in want]
        assert [i for i, loc in enumerate(got) if loc is not None] == sorted(present)
        assert all(loc[2] == 4096 + i for i, loc in enumerate(got) if loc is not None)
        assert all(loc[3] == i for i, loc in enumerate(got) if loc is not None)
        leases = [loc[1] for loc in got if loc] + [loc[1] for loc in want if loc]
        assert len(set(leases)) == 2 * len(present)  # every block its own, live lease
        assert reader.release(leases) == len(leases)
        assert not reader.transport.broken and reader.transport.pending == 0
    finally:
        st.close()
        pool.close()


def test_keys_of_several_lengths_go_the_python_way_and_nothing_is_sent_natively(served) -> None:  # noqa: F811
    pool, _st = served
    c = _client(pool, 3)
    t = c.transport
    assert t.get_many(c._epoch32, 1, [b"a" * 32, b"b" * 16], 50, NS) is None
    assert t.get_many(c._epoch32, 1, [b"a" * (t.max_payload + 1)], 1, NS) is None
    assert not t.broken and t.pending == 0
    # The client then asks the same keys the Python way (and the server refuses mixed lengths).
    with pytest.raises(ValueError, match="same length"):
        c.get_many_tuples("m", [b"a" * 32, b"b" * 16])


def _reply(blocks: list[tuple[int, int, list[tuple[int, int]], int, int]]) -> bytes:
    """A GET_MANY reply: per block (lease, nbytes, extents, checksum kind, checksum)."""
    out = struct.pack("<HH", len(blocks), 0)
    for lease, nbytes, extents, kind, crc in blocks:
        out += struct.pack("<QQHHI", lease, nbytes, len(extents), kind, crc)
        out += b"".join(struct.pack("<QQ", o, n) for o, n in extents)
    return out


def _asked(payload: bytes) -> int:
    return struct.unpack_from("<IHH", payload, 0)[1]


def _hostile(pool_path: Path, body: Callable[[int, bytes], bytes]) -> Iterator[tuple[KVIndexClient, list[int]]]:
    """A client on ring 2 whose server answers every GET_MANY with `body(nth, payload)` (and echoes
    every other request as a successful empty reply, so HELLO/OPEN_NS/PING succeed)."""
    pool = PoolMapping.open(pool_path)
    stop = threading.Event()
    mp = pool.geometry.slot_size - HEADER_SIZE
    seen = [0]

    def answer(seq: int, payload: bytes) -> tuple[int, int, bytes]:
        if len(payload) >= 8 and _asked(payload) * struct.unpack_from("<H", payload, 6)[0] + 8 == len(payload):
            seen[0] += 1
            out = body(seen[0], payload)
            return seq, min(len(out), mp), out[:mp]
        return seq, len(payload), payload

    g = pool.geometry
    assert g.shared_kv_offset <= KV < KV + (1 << 20) <= g.shared_kv_offset + g.shared_kv_size
    thread = _hostile_server(pool, 2, answer, stop)
    try:
        t = CxlTransport(pool, 2)
        c = KVIndexClient(t, address="cxl://test#2", client_id=2, timeout_s=5.0)
        c._ns["m"] = 7  # no OPEN_NS round trip to a server that cannot answer it
        c.epoch = 0
        yield c, seen
    finally:
        stop.set()
        thread.join()
        pool.close()


@pytest.fixture
def hostile(pool_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[KVIndexClient, list[int]]]:
    yield from _hostile(pool_path, request.param)


KEYS = [bytes([i]) * 32 for i in range(30)]
KV = 6 << 20  # inside the test pool's shared KV area (checked in _hostile): where the replies' extents lie


def _good(nth: int, payload: bytes) -> bytes:
    n = _asked(payload)
    return _reply([(1000 * nth + i + 1, 4096, [(KV + i * 4096, 4096)], 1, i) for i in range(n)])


@pytest.mark.parametrize("hostile", [_good], indirect=True, ids=["well-formed"])
def test_a_well_formed_reply_from_a_hand_written_server(hostile) -> None:
    c, seen = hostile
    per = p.get_many_capacity(c.transport.max_payload, 32)
    got = c.get_many_tuples("m", KEYS)
    assert seen[0] == -(-len(KEYS) // per)  # one burst of messages, each answered whole
    want = []
    for j in range(len(KEYS)):
        nth, i = j // per + 1, j % per
        want.append(([(KV + i * 4096, 4096)], 1000 * nth + i + 1, 4096, i))
    assert got == want


def _prefix_then_rest(nth: int, payload: bytes) -> bytes:
    n = _asked(payload)
    answered = n - 2 if nth == 1 else n  # the first reply leaves its last two keys out
    return _reply([(1000 * nth + i + 1, 4096, [(KV + i, 4096)], 0, 0) for i in range(answered)])


@pytest.mark.parametrize("hostile", [_prefix_then_rest], indirect=True, ids=["prefix"])
def test_keys_a_reply_left_out_are_asked_again(hostile) -> None:
    c, seen = hostile
    per = p.get_many_capacity(c.transport.max_payload, 32)
    messages = -(-len(KEYS) // per)
    got = c.get_many_tuples("m", KEYS)
    assert seen[0] == messages + 1  # the one-call burst, then one message for the two keys left out
    leases = [loc[1] for loc in got]
    assert leases[: per - 2] == [1001 + i for i in range(per - 2)]
    assert leases[per - 2 : per] == [1000 * (messages + 1) + 1, 1000 * (messages + 1) + 2]
    assert leases[per:] == [1000 * (j // per + 1) + j % per + 1 for j in range(per, len(KEYS))]
    assert all(loc[3] is None for loc in got)


def _bad_payloads() -> list:
    one = (5, 4096, [(0, 4096)], 1, 9)
    return [
        pytest.param(lambda nth, pl: b"\x01", RequestRejected, id="short-head"),  # -3 in C, as ProtocolError
        pytest.param(lambda nth, pl: _reply([]), RequestRejected, id="none-answered"),
        pytest.param(lambda nth, pl: _reply([one] * (_asked(pl) + 1)), RequestRejected, id="more-than-asked"),
        pytest.param(lambda nth, pl: _reply([one])[:-8], RequestRejected, id="extent-cut-short"),
        pytest.param(lambda nth, pl: _reply([(5, 4096, [(0, 4096)], 7, 9)]), RequestRejected, id="checksum-kind"),
        # A fake server naming the header's bytes: refused in the native decode, before any read.
        pytest.param(lambda nth, pl: _reply([one] * _asked(pl)), RequestRejected, id="extent-over-the-header"),
        pytest.param(
            lambda nth, pl: struct.pack("<HH", 1, 0) + struct.pack("<QQHHI", 5, 4096, 0xFFFF, 1, 0),
            RequestRejected,
            id="extent-count-huge",
        ),
    ]


@pytest.mark.parametrize(("body", "error"), _bad_payloads())
def test_a_malformed_payload_is_refused_and_the_ring_stays_in_step(pool_path: Path, body, error) -> None:
    for c, _seen in _hostile(pool_path, body):
        with pytest.raises((error, p.ProtocolError)):
            c.get_many_tuples("m", KEYS)
        # The whole burst was taken: the next request lines up with its own reply.
        assert not c.transport.broken and c.transport.pending == 0
        assert c.transport.call(Op.PING, 0, b"next", NS)[2] == b"next"


@pytest.mark.parametrize("hostile", [lambda nth, pl: _reply([(0, 0, [], 0, 0)] * _asked(pl))], indirect=True)
def test_absent_blocks_are_none(hostile) -> None:
    c, _seen = hostile
    assert c.get_many_tuples("m", KEYS) == [None] * 30


def test_random_replies_never_give_a_location_the_reply_did_not_carry(pool_path: Path) -> None:
    """Bounded fuzz: 300 replies of random blocks and random cuts. Each lookup either raises one of
    the client's errors (ring still in step) or returns, for every key, None or exactly the block
    the reply carried for it."""
    rng = random.Random(1234)
    carried: dict[int, list] = {}

    def body(nth: int, payload: bytes) -> bytes:
        n = _asked(payload)
        blocks = []
        for _ in range(rng.randint(0, n + 1)):
            extents = [(rng.getrandbits(40), rng.getrandbits(20)) for _e in range(rng.choice([0, 1, 1, 2, 3]))]
            lease = rng.choice([0, rng.getrandbits(63) + 1])
            blocks.append((lease, rng.getrandbits(20), extents, rng.choice([0, 1, 1, 2]), rng.getrandbits(32)))
        out = _reply(blocks)
        if rng.random() < 0.3:
            out = out[: rng.randint(0, len(out))]
        carried[nth] = blocks
        return out

    for c, seen in _hostile(pool_path, body):
        for _ in range(300):
            before = seen[0]
            try:
                got = c.get_many_tuples("m", KEYS[:7])
            except (RequestRejected, p.ProtocolError):
                assert not c.transport.broken
                continue
            except MetadataUnavailable:
                pytest.fail("a well-framed slot must never break the ring")
            replies = [carried[k] for k in range(before + 1, seen[0] + 1)]
            assert len(got) == 7
            # Every location returned is one the replies carried, at the position it was asked for.
            flat = [b for r in replies for b in r]
            for loc in got:
                if loc is None:
                    continue
                lease, nbytes, extents, kind, crc = next(b for b in flat if b[0] == loc[1])
                assert loc == (list(extents), lease, nbytes, crc if kind == 1 else None)
