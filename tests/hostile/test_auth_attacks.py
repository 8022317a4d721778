"""Authenticated endpoints (issue 30 item 3): a server whose listener must authenticate (the
"beyond loopback" decision injected as `auth="required"`, real sockets on 127.0.0.1), attacked by
clients without a key, with a wrong key, replaying a recorded handshake and stalling one; a client
holding the key against a fake server on the port; admin writes unsigned and signed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.listener_tcp import TcpLimits
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.metadata_errors import MetadataUnavailable
from belugactl.dataplane.rpc import auth
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, Op
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, until, well_behaved_round_trip

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
_FRAME = struct.Struct("<I")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "rack.secret"
    auth.create_secret(str(path), "dp-test")
    return path


@contextlib.contextmanager
def running(pool_path: Path, **config: object) -> Iterator[tuple[MetadataServer, PoolMapping]]:
    pool = PoolMapping.open(pool_path)
    limits = TcpLimits(auth_timeout_s=1.0, idle_timeout_s=30)
    server = MetadataServer(pool, ServerConfig(rpc_port=0, admin_port=0, fence_grace_s=0, tcp=limits, **config))
    server.start()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, pool
    finally:
        server.stop()
        thread.join(10)
        pool.close()


@pytest.fixture
def authed(pool_path: Path, secret: Path) -> Iterator[tuple[MetadataServer, PoolMapping]]:
    with running(pool_path, auth="required", secret_file=str(secret)) as got:
        yield got


def frame(magic: int, op: int, payload: bytes, seq: int = 1, epoch: int = 0) -> bytes:
    return _FRAME.pack(HEADER_SIZE + len(payload)) + HEADER.pack(0, seq, magic, epoch, op, 0, len(payload)) + payload


def read_frame(sock: socket.socket) -> tuple[int, int, int, bytes] | None:
    """(magic, op, code, payload) of the next frame, or None when the server closed the connection."""
    data = b""
    while len(data) < 4 or len(data) < 4 + _FRAME.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    _st, _seq, magic, _epoch, op, code, length = HEADER.unpack_from(data, 4)
    return magic, op, code, data[4 + HEADER_SIZE : 4 + HEADER_SIZE + length]


def closed(sock: socket.socket) -> bool:
    """True when the server closed the connection (after any frames it sent first)."""
    sock.settimeout(10)
    try:
        while True:
            if read_frame(sock) is None:
                return True
    except ConnectionResetError:
        return True


def ops_served(server: MetadataServer) -> int:
    return server.service.requests


def use_key(monkeypatch: pytest.MonkeyPatch, path: Path | str) -> None:
    monkeypatch.setenv(auth.ENV_KEY_FILE, str(path))


def test_a_client_without_a_key_gets_nothing(authed, monkeypatch) -> None:
    server, pool = authed
    monkeypatch.delenv(auth.ENV_KEY_FILE, raising=False)
    before = ops_served(server)
    with pytest.raises(MetadataUnavailable) as err:
        connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)
    assert "requires a credential" in str(err.value) + str(err.value.why)
    # a raw client's HELLO, PING and a request smuggled after them: none is served
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as s:
        s.sendall(frame(MAGIC, int(Op.HELLO), bytes(8)) + frame(MAGIC, int(Op.PING), b"", seq=2))
        got = read_frame(s)
        assert got is not None and got[0] == auth.AUTH_MAGIC and got[2] == auth.REQUIRED
        assert closed(s)
    assert ops_served(server) == before
    server.publish_snapshot()
    assert server.snapshot["tcp"]["auth"]["unauthenticated_refused"] == 2


def test_the_right_key_and_a_tenant_key_are_served(authed, secret, tmp_path, monkeypatch) -> None:
    server, pool = authed
    use_key(monkeypatch, secret)
    well_behaved_round_trip(f"tcp://127.0.0.1:{server.tcp_port}", pool, b"r" * 32)
    rack = auth.read_key_file(str(secret))
    auth.write_key_file(str(tmp_path / "alice.key"), rack, "alice")
    use_key(monkeypatch, tmp_path / "alice.key")
    c = connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)
    assert c.transport.server_verified
    c.close()


def test_a_wrong_key_is_refused_both_ways(authed, tmp_path, monkeypatch) -> None:
    server, pool = authed
    wrong = tmp_path / "wrong.secret"
    auth.create_secret(str(wrong))
    use_key(monkeypatch, wrong)
    before = ops_served(server)
    with pytest.raises(MetadataUnavailable) as err:
        connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)
    assert "refused the server" in str(err.value.why)  # the client saw a proof made with another key
    # a raw client that ignores the server's proof and sends a made-up one is refused and closed
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as s:
        s.sendall(frame(auth.AUTH_MAGIC, auth.HELLO, auth.hello_payload(os.urandom(32), None)))
        got = read_frame(s)
        assert got is not None and got[1] == auth.CHALLENGE
        s.sendall(frame(auth.AUTH_MAGIC, auth.PROOF, os.urandom(32)) + frame(MAGIC, int(Op.PING), b"", seq=3))
        got = read_frame(s)
        assert got is not None and got[1] == auth.DONE and got[2] == auth.REFUSED
        assert closed(s)
    assert ops_served(server) == before


def _handshake_frames(sock: socket.socket, key: bytes) -> tuple[bytes, bytes]:
    """A real client's handshake, recorded: (HELLO frame, PROOF frame)."""
    nc = os.urandom(32)
    hello = frame(auth.AUTH_MAGIC, auth.HELLO, auth.hello_payload(nc, None))
    sock.sendall(hello)
    got = read_frame(sock)
    assert got is not None and got[1] == auth.CHALLENGE
    proof_body = auth.check_challenge(auth.Credential(key), nc, got[3])
    assert proof_body is not None
    proof = frame(auth.AUTH_MAGIC, auth.PROOF, proof_body)
    sock.sendall(proof)
    got = read_frame(sock)
    assert got is not None and got[1] == auth.DONE and got[2] == auth.OK
    return hello, proof


def test_a_recorded_handshake_does_not_replay(authed, secret) -> None:
    server, pool = authed
    key = auth.read_key_file(str(secret)).key
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as s:
        hello, proof = _handshake_frames(s, key)
        s.sendall(frame(MAGIC, int(Op.HELLO), bytes(8), seq=9))
        got = read_frame(s)
        assert got is not None and got[0] == MAGIC and got[2] == 0  # served after the handshake
    before = ops_served(server)
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as s:
        s.sendall(hello)
        got = read_frame(s)
        assert got is not None and got[1] == auth.CHALLENGE  # a fresh server nonce
        s.sendall(proof + frame(MAGIC, int(Op.HELLO), bytes(8), seq=9))
        got = read_frame(s)
        assert got is not None and got[1] == auth.DONE and got[2] == auth.REFUSED
        assert closed(s)
    assert ops_served(server) == before


def test_a_slow_handshake_stalls_nobody_and_is_closed(authed, secret, monkeypatch) -> None:
    server, pool = authed
    use_key(monkeypatch, secret)
    hello = frame(auth.AUTH_MAGIC, auth.HELLO, auth.hello_payload(os.urandom(32), None))
    slow = [socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) for _ in range(8)]
    try:
        for s in slow:
            s.sendall(hello[:7])  # half a frame, then nothing
        for i in range(3):  # others connect, authenticate and are served meanwhile
            well_behaved_round_trip(f"tcp://127.0.0.1:{server.tcp_port}", pool, bytes([i]) * 32)
        assert all(closed(s) for s in slow)  # the handshake deadline (1 s here) closed them
    finally:
        for s in slow:
            s.close()
    server.publish_snapshot()
    assert server.snapshot["tcp"]["auth"]["timed_out"] >= 8


def test_an_oversized_frame_before_the_handshake_is_refused(authed) -> None:
    server, pool = authed
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as s:
        s.sendall(_FRAME.pack(60_000) + bytes(1000))  # a big frame is never buffered before the handshake
        assert closed(s)
    server.publish_snapshot()
    tcp = server.snapshot["tcp"]
    assert tcp["closed_oversize"] == 1 and tcp["auth"]["timed_out"] == 0  # refused at once, not at the deadline


class FakeServer:
    """Binds the port and answers like a metadata server that knows no key: a reply pointing the
    client's writes at the pool header. Records every byte it is sent."""

    def __init__(self, answer: str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(5)
                data = conn.recv(65536)
                self.received += data
                if self.answer == "bad-magic":  # an old or fake server: the protocol's error frame
                    conn.sendall(frame(MAGIC, 0, b""))
                elif self.answer == "forged":  # a challenge with a made-up proof
                    conn.sendall(frame(auth.AUTH_MAGIC, auth.CHALLENGE, os.urandom(64)))
                with contextlib.suppress(OSError):
                    self.received += conn.recv(65536)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.mark.parametrize("answer", ["bad-magic", "forged"])
def test_a_fake_server_is_refused_before_any_byte_reaches_the_pool(pool_path, secret, monkeypatch, answer) -> None:
    use_key(monkeypatch, secret)
    before = hashlib.sha256(pool_path.read_bytes()).digest()
    fake = FakeServer(answer)
    pool = PoolMapping.open(pool_path)
    try:
        with pytest.raises(MetadataUnavailable) as err:
            c = connect(f"tcp://127.0.0.1:{fake.port}", pool=pool, timeout_s=3)
            r = c.reserve(NS, b"x" * 32, 4096)  # never reached: the fake's reply would aim at the header
            pool.write(r.extents[0][0], b"\xff" * 4096)
        assert "refused the server" in str(err.value.why)
    finally:
        pool.close()
        fake.close()
    # the fake got the handshake's HELLO only: no request, and the pool is untouched
    assert fake.received[4 + 16 : 4 + 20] == struct.pack("<I", auth.AUTH_MAGIC)
    assert len(fake.received) == 4 + HEADER_SIZE + len(auth.hello_payload(bytes(32), None))
    assert hashlib.sha256(pool_path.read_bytes()).digest() == before


def test_a_loopback_server_with_the_secret_proves_itself_to_a_client_that_asks(pool_path, secret, monkeypatch) -> None:
    with running(pool_path, secret_file=str(secret)) as (server, pool):  # auth "auto" on 127.0.0.1
        monkeypatch.delenv(auth.ENV_KEY_FILE, raising=False)
        c = connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)  # no key: as today
        assert not c.transport.server_verified
        c.close()
        use_key(monkeypatch, secret)
        c = connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)
        assert c.transport.server_verified
        c.close()


def test_a_loopback_server_without_a_secret_is_refused_by_a_client_with_a_key(pool_path, secret, monkeypatch) -> None:
    with running(pool_path) as (server, pool):
        use_key(monkeypatch, secret)
        with pytest.raises(MetadataUnavailable) as err:
            connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)
        assert "refused the server" in str(err.value.why)  # it answered BAD_MAGIC: no proof


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_admin_writes_need_a_signature_and_gets_stay_open(authed, secret) -> None:
    server, pool = authed
    base = f"http://127.0.0.1:{server.admin_port}"
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:  # noqa: S310 - loopback
        assert json.loads(r.read())["status"] == "ok"
    body = b'{"ranges": []}'
    status, answer = _post(base + "/poison", body, {"Content-Type": "application/json"})
    assert status == 401 and b"sign" in answer
    wrong = auth.sign_admin_request(os.urandom(32), "POST", "/poison", body)
    assert _post(base + "/poison", body, {"Authorization": wrong})[0] == 401
    key = auth.read_key_file(str(secret)).key
    signed = auth.sign_admin_request(key, "POST", "/poison", body)
    status, _ = _post(base + "/poison", body, {"Authorization": signed})
    assert status != 401  # past the check: the endpoint itself answers (501 where it does not exist yet)
    assert _post(base + "/poison", body, {"Authorization": signed})[0] == 401  # replayed
    assert until(lambda: server.admin.writes_refused >= 3, 5)


def test_a_tenant_key_binds_the_connection_to_its_tenant(authed, secret, tmp_path, monkeypatch) -> None:
    server, pool = authed
    bound: list[tuple[int, str]] = []
    monkeypatch.setattr(server.service, "bind_tenant", lambda owner, tenant: bound.append((owner, tenant)) or True)
    auth.write_key_file(str(tmp_path / "alice.key"), auth.read_key_file(str(secret)), "alice")
    use_key(monkeypatch, tmp_path / "alice.key")
    connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5).close()
    assert [t for _o, t in bound] == ["alice"]
    use_key(monkeypatch, secret)  # the rack secret proves no tenant: nothing to bind
    connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5).close()
    assert [t for _o, t in bound] == ["alice"]
