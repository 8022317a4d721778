"""No wrong byte without a checksum, by construction (issue 30, item 1).

- A commit without the block's CRC32C (an old client's token-only COMMIT, a COMMIT_MANY item of
  checksum kind 0) is refused by a real server with NO_CHECKSUM, counted, and nothing becomes
  visible; the client cannot even build one.
- A fake server on the RPC port (a small socket server here, speaking the real protocol) cannot
  make a client write or read outside the shared KV area of the pool header, nor be taken for the
  pool's server when its epoch is not the header's.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataError, MetadataUnavailable, NotOwner
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.header import HEADER_REGION
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, read_block, until, well_behaved_round_trip, write_block

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(120)]
_FRAME = struct.Struct("<I")


def _raw(client, op: int, payload: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side checks) and return the server's code and reply."""
    code, _epoch, reply = client.transport.call(op, client._epoch32, payload, int(5e9))
    return code, reply


@pytest.mark.parametrize("kind", ["cxl", "tcp"])
def test_a_commit_without_a_checksum_is_refused_and_counted(mds, kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    c = connect(mds.cxl(1), pool=pool, timeout_s=5) if kind == "cxl" else connect(mds.tcp, pool=pool, timeout_s=5)
    n = 16 << 10
    keys = [f"nocrc-{kind}-{i}".encode().ljust(32, b".") for i in range(3)]
    rs = [c.reserve(NS, k, n) for k in keys]
    for k, r in zip(keys, rs, strict=True):
        write_block(pool, r.extents, content(k, n))
    # The client API will not build one.
    with pytest.raises(TypeError):
        c.commit(rs[0].token)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="CRC32C"):
        c.commit(rs[0].token, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="CRC32C"):
        c.commit_many([(rs[0].token, None)])  # type: ignore[list-item]
    # On the wire: an old client's token-only COMMIT, the 16-byte form with kind 0, a COMMIT_MANY item.
    assert _raw(c, Op.COMMIT, p.encode_u64(rs[0].token))[0] == Code.NO_CHECKSUM
    assert _raw(c, Op.COMMIT, p.encode_u64(rs[0].token) + bytes(8))[0] == Code.NO_CHECKSUM
    many = struct.pack("<HHI", 2, 0, 0) + struct.pack("<QIHH", rs[1].token, 0, p.CHECKSUM_NONE, 0)
    many += struct.pack("<QIHH", rs[2].token, native.crc32c(content(keys[2], n)), p.CHECKSUM_CRC32C, 0)
    code, reply = _raw(c, Op.COMMIT_MANY, many)
    assert code == 0 and p.decode_codes_reply(reply, "r") == [Code.NO_CHECKSUM, Code.OK]
    assert c.get(NS, keys[0]) is None and c.get(NS, keys[1]) is None  # nothing unverifiable is visible
    assert until(lambda: mds.stats()["requests"]["errors_by_code"].get("NO_CHECKSUM", 0) >= 3, 2)
    # The refused reservations stay their writer's: committed with the CRC they are served, verified.
    assert c.commit_many([(r.token, native.crc32c(content(k, n))) for k, r in zip(keys[:2], rs[:2], strict=True)]) == [
        Code.OK,
        Code.OK,
    ]
    for k, loc in zip(keys, c.get_many(NS, keys), strict=True):
        assert loc is not None and loc.checksum == native.crc32c(content(k, n))
        assert read_block(pool, loc.extents) == content(k, n)
        c.release([loc.lease_id])
    well_behaved_round_trip(mds.cxl(4) if kind == "cxl" else mds.tcp, pool, b"after-" + kind.encode() + b"." * 26)
    c.close()
    pool.close()


# --- a fake server on the RPC port ------------------------------------------------------------
@contextlib.contextmanager
def fake_server(answer: Callable[[int, bytes], tuple[int, bytes]]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that frames replies as the real one does and answers each request
    with `answer(op, payload)` -> (code, reply payload). One client at a time; stopped on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        conn.settimeout(0.2)
        rx = bytearray()
        with conn:
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                rx += chunk
                while len(rx) >= 4 and len(rx) >= 4 + _FRAME.unpack_from(rx)[0]:
                    size = _FRAME.unpack_from(rx)[0]
                    _st, seq, _magic, epoch, op, _code, length = p.HEADER.unpack_from(rx, 4)
                    payload = bytes(rx[4 + p.HEADER_SIZE : 4 + size])
                    del rx[: 4 + size]
                    code, reply = answer(op, payload)
                    frame = bytearray(4 + p.HEADER_SIZE + len(reply))
                    _FRAME.pack_into(frame, 0, p.HEADER_SIZE + len(reply))
                    p.HEADER.pack_into(frame, 4, 0, seq, p.MAGIC, epoch, op, code, len(reply))
                    frame[4 + p.HEADER_SIZE :] = reply
                    conn.sendall(frame)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            serve(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _answers(epoch: int, extents: list[tuple[int, int]]) -> Callable[[int, bytes], tuple[int, bytes]]:
    """What the fake server says: HELLO with `epoch`, and every location or reservation at `extents`."""

    def answer(op: int, payload: bytes) -> tuple[int, bytes]:
        if op == Op.HELLO:
            return 0, p.encode_hello_reply(epoch, 4242, 4096, 30_000, 10_000)
        if op == Op.OPEN_NS:
            return 0, p.encode_u32(1)
        if op == Op.RESERVE:
            return 0, p.encode_reserve_reply(0x1234, extents)
        if op == Op.RESERVE_MANY:
            _ns, items = p.decode_reserve_many(payload)
            return 0, p.encode_many_reply(
                [p.encode_reserve_many_item(0, 0x1234 + i, extents) for i in range(len(items))]
            )
        if op == Op.GET:
            return 0, p.encode_get_reply(77, sum(n for _o, n in extents), extents, 0)
        if op == Op.GET_MANY:
            _ns, keys = p.decode_lookup(payload)
            item = p.encode_get_many_item(77, sum(n for _o, n in extents), extents, 0)
            return 0, p.encode_many_reply([item] * len(keys))
        return int(Code.BAD_OP), b""

    return answer


def _header_bytes(pool_path: Path) -> bytes:
    with open(pool_path, "rb") as f:
        return f.read(HEADER_REGION)


def test_a_fake_server_with_another_epoch_is_not_taken_for_the_pools(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    with fake_server(_answers(pool.epoch() + 7, [(pool.geometry.shared_kv_offset, 4096)])) as address:
        with pytest.raises(MetadataUnavailable) as exc:
            connect(address, pool=pool, timeout_s=2)
        assert "pool header's epoch word" in str(exc.value.why)
        # Without a pool to hold it to, a client cannot tell (it also writes and reads nothing).
        connect(address, timeout_s=2).close()
    pool.close()


@pytest.mark.parametrize(
    "where",
    [
        "over the header",
        "straddling the area's start",
        "past the area's end",
        "past the pool",
    ],
)
def test_a_fake_servers_extents_outside_the_shared_kv_area_are_refused(pool_path: Path, where: str) -> None:
    pool = PoolMapping.open(pool_path)
    g = pool.geometry
    start, end = g.shared_kv_offset, g.shared_kv_offset + g.shared_kv_size
    extents = {
        "over the header": [(0, 4096)],
        "straddling the area's start": [(start - 4096, 8192)],
        "past the area's end": [(start, 4096), (end - 4096, 8192)],
        "past the pool": [(start, 4096), (1 << 63, 4096)],
    }[where]
    before = _header_bytes(pool_path)
    # The fake server knows the header's epoch (a local user who can read it): the extents are the attack.
    with fake_server(_answers(pool.epoch(), extents)) as address:
        c = connect(address, pool=pool, timeout_s=2)
        key = b"k" * 32
        for call in (
            lambda: c.reserve(NS, key, 8192),
            lambda: c.reserve_many(NS, [(key, 8192)]),
            lambda: c.get(NS, key),
            lambda: c.get_many_tuples(NS, [key, b"j" * 32]),
        ):
            with pytest.raises((MetadataError, p.ProtocolError)) as exc:
                call()
            assert "outside the shared KV area" in f"{exc.value} {getattr(exc.value, 'why', '')}"
        c.close()
    # What a writer would have done with a reservation: never reached. The header is intact.
    assert _header_bytes(pool_path) == before
    pool.close()
    PoolMapping.open(pool_path).close()  # every host still accepts the pool


def test_the_pools_own_server_passes_the_same_checks(mds) -> None:
    """The real server over TCP with the pool given: the epoch matches and every extent is inside."""
    pool = PoolMapping.open(mds.pool_path)
    well_behaved_round_trip(mds.tcp, pool, b"tcp-with-pool".ljust(32, b"."))
    c = connect(mds.tcp, pool=pool, timeout_s=5)
    assert c.epoch == pool.epoch() and c.kv_area[0] == pool.geometry.shared_kv_offset
    c.close()
    pool.close()


# --- the lease hand-over: only the releaser's group -------------------------------------------
@pytest.mark.parametrize("attacker_kind", ["cxl", "tcp"])
def test_a_stranger_that_learned_a_lease_id_cannot_free_the_readers_block(mds, attacker_kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    group = int.from_bytes(b"engine-A", "little")
    scheduler = connect(mds.cxl(1), pool=pool, timeout_s=5, handover_group=group)  # looks blocks up
    worker = connect(mds.cxl(2), pool=pool, timeout_s=5, handover_group=group)  # copies and releases
    if attacker_kind == "cxl":  # it reads lease ids from other rings' reply slots in the pool
        attacker = connect(mds.cxl(3), pool=pool, timeout_s=5, handover_group=group ^ 1)
    else:  # it was told the id; it even says a group, just not this engine's
        attacker = connect(mds.tcp, pool=pool, timeout_s=5, handover_group=group + 1)
    n = 64 << 10
    key = f"leased-{attacker_kind}".encode().ljust(32, b".")
    r = worker.reserve(NS, key, n)
    write_block(pool, r.extents, content(key, n))
    worker.commit(r.token, native.crc32c(content(key, n)))
    (loc,) = scheduler.get_many(NS, [key])
    assert loc is not None
    # The block is deleted while leased: it is freed when its last lease ends, not before.
    assert scheduler.delete(NS, key)
    refused = mds.stats()["requests"]["foreign_refused"]
    for _ in range(50):  # bounded: every try is refused alike
        with pytest.raises(NotOwner):
            attacker.release([loc.lease_id], granted_elsewhere=True)
    assert until(lambda: mds.stats()["requests"]["foreign_refused"] >= refused + 50, 2)
    # The next writers do not get the leased block's extents while the worker copies.
    held = {off for off, _n in loc.extents}
    for i in range(8):
        other = attacker.reserve(NS, f"next-{attacker_kind}-{i}".encode().ljust(32, b"."), n)
        assert not held & {off for off, _n in other.extents}
        attacker.abort(other.token)
    assert read_block(pool, loc.extents) == content(key, n)
    # The engine's own worker may release what its scheduler passed it.
    assert worker.release([loc.lease_id], granted_elsewhere=True) == 1
    for c in (scheduler, worker, attacker):
        c.close()
    pool.close()
