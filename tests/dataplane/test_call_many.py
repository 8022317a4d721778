"""The client's pipelined burst on a CXL-RPC ring (`CxlTransport.call_many`): the native call that
waits for a whole burst with one GIL hand-off, next to the Python loop it replaces. Both run against a
real server (its loop in a thread) or against a hostile one that answers with bad slots."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds.ownership import LeaseCodec
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc import transport_cxl
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, REQ_READY, RESP_READY, Op
from belugactl.dataplane.rpc.transport import TransportError
from belugactl.dataplane.rpc.transport_cxl import CxlTransport
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.conftest import native_param
from tests.support.blocks import zeros_crc

NS = 5_000_000_000
SHORT_NS = 200_000_000

NATIVE_BURST = pytest.param(True, id="native", marks=pytest.mark.native)
PATHS = [NATIVE_BURST, pytest.param(False, id="python")]


@pytest.fixture
def use_native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setattr(transport_cxl, "_rpc_call_many", None)
    return request.param


class ServerThread:
    """A real metadata server answering its rings from a thread."""

    def __init__(self, pool: PoolMapping, *, fast_path: bool) -> None:
        config = ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=fast_path)
        self.server = MetadataServer(pool, config)
        self.server.start()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.server.ring.serve(1_000_000)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


def serve_pool(pool: PoolMapping, *, flush: bool) -> Iterator[tuple[PoolMapping, ServerThread]]:
    """`pool` served by a real server thread (fast path on), flushing as a non-coherent host would."""
    pool.needs_flush = flush
    st = ServerThread(pool, fast_path=True)
    try:
        yield pool, st
    finally:
        st.close()
        pool.close()


@pytest.fixture(params=[False, True], ids=["flush-off", "flush-on"])
def served(pool_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[PoolMapping, ServerThread]]:
    yield from serve_pool(PoolMapping.open(pool_path), flush=request.param)


@pytest.mark.parametrize("use_native", PATHS, indirect=True)
def test_a_burst_longer_than_the_ring_comes_back_in_order(served, use_native: bool) -> None:
    pool, st = served
    t = CxlTransport(pool, 3)
    n = 3 * pool.geometry.slots_per_ring + 5  # wraps the ring three times
    payloads = [struct.pack("<I", i) * (1 + i % 7) for i in range(n)]
    replies = t.call_many(Op.PING, st.server.epoch, payloads, NS)
    assert [r[2] for r in replies] == payloads
    assert all(code == 0 for code, _e, _r in replies)
    # The ring stays in step: a QD1 call and a second burst after it both line up.
    assert t.call(Op.PING, st.server.epoch, b"one", NS)[2] == b"one"
    assert [r[2] for r in t.call_many(Op.PING, st.server.epoch, [b"a", b"b"], NS)] == [b"a", b"b"]
    assert not t.broken and t.pending == 0


@pytest.mark.parametrize("use_native", PATHS, indirect=True)
def test_error_codes_come_back_per_request(served, use_native: bool) -> None:
    pool, st = served
    t = CxlTransport(pool, 4)
    st.server.index.open_namespace("m")
    # A GET of a missing key fails (NOT_FOUND) between two pings that succeed.
    from belugactl.dataplane.rpc import protocol as p

    ns = st.server.index.open_namespace("m")
    replies = t.call_many(Op.PING, st.server.epoch, [b"x"], NS)
    replies += t.call_many(Op.GET, st.server.epoch, [p.encode_key(ns, b"k" * 32)], NS)
    assert replies[0][0] == 0 and replies[1][0] != 0
    assert not t.broken


@pytest.mark.parametrize("use_native", PATHS, indirect=True)
def test_no_server_times_out_and_breaks_the_ring(pool_path: Path, use_native: bool) -> None:
    pool = PoolMapping.open(pool_path)
    try:
        t = CxlTransport(pool, 1)
        with pytest.raises(TransportError, match="no reply"):
            t.call_many(Op.PING, 1, [b"a", b"b", b"c"], SHORT_NS)
        assert t.broken
    finally:
        pool.close()


@pytest.mark.parametrize("use_native", PATHS, indirect=True)
def test_a_slot_still_busy_from_an_abandoned_request_is_refused(pool_path: Path, use_native: bool) -> None:
    pool = PoolMapping.open(pool_path)
    try:
        t = CxlTransport(pool, 1)
        off = pool.geometry.slot_offset(1, t._seq % pool.geometry.slots_per_ring)
        native.store64(pool.buf, off, REQ_READY, False)
        with pytest.raises(TransportError, match="still busy"):
            t.call_many(Op.PING, 1, [b"a", b"b"], SHORT_NS)
        assert t.broken
    finally:
        pool.close()


def _hostile_server(pool: PoolMapping, ring: int, answer, stop: threading.Event) -> threading.Thread:
    """Answers each request of `ring` with `answer(seq, payload) -> (seq, length field, payload)`."""
    g = pool.geometry
    offs = [g.slot_offset(ring, s) for s in range(g.slots_per_ring)]
    max_payload = g.slot_size - HEADER_SIZE

    def loop() -> None:
        i = 0
        while not stop.is_set():
            off = offs[i % len(offs)]
            if native.load64(pool.buf, off) != REQ_READY:
                continue
            _st, seq, _m, epoch, op, _c, n = struct.unpack_from("<QQIIHHI", pool.buf, off)
            payload = bytes(pool.buf[off + HEADER_SIZE : off + HEADER_SIZE + min(n, max_payload)])
            rseq, length, body = answer(seq, payload)
            # The reply written by hand (what a buggy or hostile server can publish), status last.
            pool.buf[off + HEADER_SIZE : off + HEADER_SIZE + len(body)] = body
            HEADER.pack_into(pool.buf, off, REQ_READY, rseq, MAGIC, epoch, op, 0, length)
            native.store64(pool.buf, off, RESP_READY, False)
            i += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("use_native", PATHS, indirect=True)
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda seq, pl, mp: (seq + 1, len(pl), pl), id="wrong-seq"),
        pytest.param(lambda seq, pl, mp: (seq, mp + 1, pl), id="length-past-the-slot"),
        pytest.param(lambda seq, pl, mp: (seq, 0xFFFFFFFF, pl), id="length-huge"),
    ],
)
def test_a_malformed_reply_breaks_the_ring_and_never_returns_bytes(pool_path: Path, use_native: bool, bad) -> None:
    pool = PoolMapping.open(pool_path)
    stop = threading.Event()
    mp = pool.geometry.slot_size - HEADER_SIZE
    count = [0]

    def answer(seq: int, pl: bytes) -> tuple[int, int, bytes]:
        count[0] += 1
        return bad(seq, pl, mp) if count[0] == 3 else (seq, len(pl), pl)  # the third reply is bad

    thread = _hostile_server(pool, 2, answer, stop)
    try:
        t = CxlTransport(pool, 2)
        with pytest.raises(TransportError, match="malformed"):
            t.call_many(Op.PING, 1, [bytes([i]) * 8 for i in range(6)], NS)
        assert t.broken
    finally:
        stop.set()
        thread.join()
        pool.close()


def test_bad_arguments_are_refused_before_anything_is_sent(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    try:
        t = CxlTransport(pool, 1)
        with pytest.raises(ValueError, match="exceeds"):
            t.call_many(Op.PING, 1, [b"a", b"x" * (t.max_payload + 1)], SHORT_NS)
        assert t.status_of_next() != REQ_READY  # nothing went out
        if transport_cxl._rpc_call_many is not None:
            offsets = b"".join(o.to_bytes(8, "little") for o in t._offsets)
            call_many = transport_cxl._rpc_call_many
            with pytest.raises(TypeError):
                call_many(pool.buf, offsets, 0, 1, Op.PING, ["text"], t.max_payload, 4, SHORT_NS, False)
            with pytest.raises(ValueError):  # a window wider than the ring
                call_many(pool.buf, offsets, 0, 1, Op.PING, [b"a"], t.max_payload, len(t._offsets) + 1, SHORT_NS, False)
            with pytest.raises(ValueError):  # a slot offset past the buffer
                call_many(pool.buf, (len(pool.buf)).to_bytes(8, "little"), 0, 1, Op.PING, [b"a"], 8, 1, SHORT_NS, False)
            assert call_many(pool.buf, offsets, 0, 1, Op.PING, [], t.max_payload, 4, SHORT_NS, False) == []
    finally:
        pool.close()


@pytest.mark.parametrize("decode", [native_param(lambda *a: native._native.lease_decode_many(*a))])
def test_the_native_release_decode_is_the_python_one(decode) -> None:
    codec = LeaseCodec((0x01234567, 0x89ABCDEF, 0xDEADBEEF, 7))
    pairs = [(1, 5), (2, 5), (123456789, 5), ((1 << 44) - 1, 5), (9, 6), (10, 0)]
    ids = b"".join(struct.pack("<Q", codec.encode(seq, owner)) for seq, owner in pairs)
    assert decode(codec.key_bytes, ids, 5) == ([seq for seq, _o in pairs], 2)
    assert LeaseCodec.decode_many(codec, ids, 5) == ([seq for seq, _o in pairs], 2)
    with pytest.raises(ValueError):
        decode(codec.key_bytes, ids[:-1], 5)


@pytest.mark.parametrize("slot", ["256B", "4KiB", "8KiB"])
@pytest.mark.parametrize("fast", [True, False], ids=["native-server", "python-server"])
def test_a_long_prompts_lookup_is_one_burst_whatever_the_slot_size(tmp_path: Path, slot: str, fast: bool) -> None:
    """125 block keys (a 4000-token prompt, block size 32): every key located with its own lease in
    one pipelined burst, and the leases handed back in one more. With 8 KiB slots a single message
    of 125 keys would outgrow the fast path's 4 KiB reply and cost a second round trip."""
    from belugactl.dataplane.client import KVIndexClient
    from belugactl.pool.file_pool import create_file_pool
    from tests.dataplane.test_batched_puts import RACK_64

    manifest = tmp_path / "rack.yaml"
    manifest.write_text(RACK_64.replace("slot_size: 256B", f"slot_size: {slot}"))
    pool = PoolMapping.open(create_file_pool(tmp_path / "pool.bin", manifest))
    st = ServerThread(pool, fast_path=fast)
    try:
        c = KVIndexClient(CxlTransport(pool, 1), address="cxl://test#1", client_id=1, timeout_s=5.0)
        c.reconnect()
        keys = [bytes([i]) * 32 for i in range(125)]
        for k in keys[:120]:
            c.commit(c.reserve("m", k, 4096).token, zeros_crc(4096))
        trips, sent = c.round_trips, c.messages
        located = c.get_many_tuples("m", keys)
        assert c.round_trips - trips == 1
        per_message = min(
            p.get_many_capacity(c.transport.max_payload, 32), (p.FAST_REPLY_MAX - 4) // 40
        )
        assert c.messages - sent == -(-125 // per_message)
        assert [loc is not None for loc in located] == [True] * 120 + [False] * 5
        assert len({loc[1] for loc in located if loc}) == 120  # a lease each
        assert all(loc[2] == 4096 and sum(n for _o, n in loc[0]) == 4096 for loc in located if loc)
        trips = c.round_trips
        assert c.release([loc[1] for loc in located if loc]) == 120
        assert c.round_trips - trips == 1
    finally:
        st.close()
        pool.close()
