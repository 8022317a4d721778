"""CXL-RPC slots driven by hand: the server is polled in this process (`poll_once`), no threads."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belugactl.dataplane import native
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import RESP_READY, Code, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

NS = 5_000_000_000


def make_server(pool_path: Path) -> tuple[PoolMapping, MetadataServer]:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    server.start()
    return pool, server


def call(t: CxlTransport, server: MetadataServer, op: int, payload: bytes, epoch: int | None = None):
    t.submit(op, server.epoch if epoch is None else epoch, payload)
    assert server.poll_once(NS)
    return t.collect(NS)


def test_requests_round_trip_across_ring_wrap(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 2)
    code, epoch, rep = call(t, server, Op.HELLO, p.encode_hello(2))
    assert code == 0 and p.decode_hello_reply(rep)[0] == server.epoch == 1
    ns = p.decode_u32(call(t, server, Op.OPEN_NS, p.encode_name("m/tp0"))[2], "ns")
    for i in range(3 * pool.geometry.slots_per_ring):
        code, _e, rep = call(t, server, Op.PING, i.to_bytes(4, "little"))
        assert code == 0 and rep == i.to_bytes(4, "little")
    code, _e, rep = call(t, server, Op.RESERVE, p.encode_reserve(ns, b"k" * 32, 1000))
    token, extents = p.decode_reserve_reply(rep)
    assert code == 0 and extents[0][0] >= pool.geometry.shared_kv_offset
    assert call(t, server, Op.COMMIT, p.encode_commit(token, zeros_crc(1000)))[0] == 0
    code, _e, rep = call(t, server, Op.LOOKUP_PREFIX, p.encode_lookup(ns, [b"k" * 32, b"j" * 32]))
    assert p.decode_lookup_reply(rep)[0] == 1
    server.close()
    pool.close()


def test_pipelined_requests_are_served_in_order(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 0)
    for i in range(pool.geometry.slots_per_ring):
        t.submit(Op.PING, server.epoch, bytes([i]))
    while server.poll_once(0):
        pass
    assert [t.collect(NS)[2] for _ in range(pool.geometry.slots_per_ring)] == [
        bytes([i]) for i in range(pool.geometry.slots_per_ring)
    ]
    server.close()
    pool.close()


def test_reconnecting_client_is_found_at_slot_zero(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 1)
    for _ in range(3):
        assert call(t, server, Op.PING, b"a")[0] == 0
    t.reset()  # a new process takes the ring over: starts again at slot 0
    assert call(t, server, Op.PING, b"b")[2] == b"b"
    assert call(t, server, Op.PING, b"c")[2] == b"c"
    server.close()
    pool.close()


def test_wrong_epoch_is_fenced(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 1)
    assert call(t, server, Op.PING, b"x", epoch=server.epoch + 1)[0] == Code.STALE_EPOCH
    assert call(t, server, Op.HELLO, p.encode_hello(1), epoch=12345)[0] == 0  # HELLO is how a client learns it
    server.close()
    pool.close()


def test_requests_left_by_a_dead_server_are_answered_stale_by_the_next(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 3)
    t.submit(Op.PING, server.epoch, b"orphan")  # the server dies before serving it
    server.close()  # as a killed process would, it lets go of the pool lock
    pool2, server2 = make_server(pool_path)
    assert server2.epoch == server.epoch + 1 and server2.ring.stale_fenced == 1
    assert t.collect(NS)[0] == Code.STALE_EPOCH
    server2.close()
    pool2.close()
    pool.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=32, max_size=256), keep_magic=st.booleans())
def test_corrupted_slot_bytes_get_an_error_reply_and_the_server_keeps_serving(
    pool_path: Path, garbage: bytes, keep_magic: bool
) -> None:
    pool, server = make_server(pool_path)
    g = pool.geometry
    off = g.slot_offset(4, 0)
    raw = bytearray(garbage)
    if keep_magic:
        struct.pack_into("<I", raw, 16, p.MAGIC)
    pool.buf[off : off + len(raw)] = raw
    native.store64(pool.buf, off, p.REQ_READY)  # a scribbling client published it
    errors_before = server.service.error_count
    assert server.poll_once(NS)
    assert native.load64(pool.buf, off) == RESP_READY
    code = struct.unpack_from("<H", pool.buf, off + 26)[0]
    if not keep_magic and struct.unpack_from("<I", raw, 16)[0] != p.MAGIC:
        assert code == Code.BAD_MAGIC
    if code:
        assert server.service.error_count == errors_before + 1
    # Another client is unaffected.
    t = CxlTransport(pool, 0)
    assert call(t, server, Op.PING, b"still here")[2] == b"still here"
    server.close()
    pool.close()


def test_a_second_server_on_the_same_pool_is_refused(pool_path: Path) -> None:
    from belugactl.errors import EnvironmentProblem

    pool, server = make_server(pool_path)
    with pytest.raises(EnvironmentProblem, match="another metadata server"):
        make_server(pool_path)
    assert pool.epoch() == server.epoch  # the refused one did not bump it
    server.close()
    pool.close()


@pytest.mark.parametrize("fast", [False, True])
def test_flush_mode_round_trips(pool_path: Path, fast: bool) -> None:
    """The code paths a shared write-back devdax pool takes (flush before publish, evict before read)."""
    pool = PoolMapping.open(pool_path)
    pool.needs_flush = True
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=fast))
    server.start()
    assert server.flush
    t = CxlTransport(pool, 1)
    assert t.flush
    ns = server.index.open_namespace("m")
    token, _ = server.index.reserve(ns, b"k" * 32, 5000)
    server.index.commit(token)
    for _ in range(2 * pool.geometry.slots_per_ring):
        t.submit(Op.LOOKUP_PREFIX, server.epoch, p.encode_lookup(ns, [b"k" * 32]))
        if fast and server.ring._fast is not None:
            served, stop = server.ring.fast_burst(0, NS)
            assert served == 1 and stop == -1
        else:
            assert server.poll_once(NS)
        code, _e, rep = t.collect(NS)
        assert code == 0 and p.decode_lookup_reply(rep)[0] == 1
    pool.write(pool.geometry.shared_kv_offset, b"published")
    assert pool.read(pool.geometry.shared_kv_offset, 9) == b"published"
    server.close()
    pool.close()


def test_client_call_path_in_flush_mode_with_a_server_thread(pool_path: Path) -> None:
    import threading

    pool = PoolMapping.open(pool_path)
    pool.needs_flush = True
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0, fast_path=False))
    server.start()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            server.poll_once(1_000_000)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        from belugactl.dataplane.client import KVIndexClient

        client = KVIndexClient(CxlTransport(pool, 2), address="cxl://test#2", client_id=2, timeout_s=5.0)
        assert client.reconnect() == server.epoch
        r = client.reserve("m", b"a" * 32, 4096)
        client.commit(r.token, zeros_crc(r.nbytes))
        assert client.lookup_prefix("m", [b"a" * 32]) == 1
        assert client.lookup_prefix("m", [b"a" * 32, b"b" * 32]) == 1
        pool.bump_epoch()  # as a restarted server would: the client is fenced before sending
        from belugactl.dataplane.metadata_errors import StaleEpoch

        with pytest.raises(StaleEpoch):
            client.lookup_prefix("m", [b"a" * 32])
    finally:
        stop.set()
        thread.join()
        server.close()
        pool.close()


def test_a_ring_out_of_step_is_resynced_by_housekeeping(pool_path: Path) -> None:
    pool, server = make_server(pool_path)
    t = CxlTransport(pool, 1)
    for _ in range(3):
        assert call(t, server, Op.PING, b"a")[0] == 0  # server cursor now at slot 3
    t.reset()
    t._seq += 5  # a client that starts mid-ring without a HELLO at slot 0
    t.submit(Op.PING, server.epoch, b"lost")
    assert not server.poll_once(0)  # nobody watches slot 5
    server.housekeeping()
    assert server.ring.rings_resynced == 1
    assert server.poll_once(NS) and t.collect(NS)[2] == b"lost"
    server.close()
    pool.close()
