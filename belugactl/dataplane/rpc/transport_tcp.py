"""The TCP client transport: the same messages, length-prefixed (`tcp://<host>:<port>`).

Candidates (issue 32): `tcp://a:9471,b:9471` names the rack's metadata servers, the elected leader
and its standbys (at most 16). Only the leader binds the RPC port (a standby answers nothing), so
a connection goes to the first candidate that accepts it and completes the handshake, starting
from the one that answered last; `advance()` makes the next connection start at the next one
(the client's failover loop, dataplane/client.py, calls it when HELLO fails on a candidate).

A client holding a key (`key_file=`, else `$BELUGA_KEY_FILE`: the rack secret or a tenant's key)
runs the handshake of rpc/auth.py on every connection before its first frame, and refuses a server
that cannot prove the same key (a fake server on the port) before any request is sent, so before
any reply could point it at pool bytes. Without a key it connects as before; a server that
requires one then says so and closes, and the client's error says how to get one.
"""

from __future__ import annotations

import os
import random
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from belugactl.dataplane.rpc import auth
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, TCP_MAX_PAYLOAD
from belugactl.dataplane.rpc.transport import ClientTransport, Reply, TransportError, register_transport
from belugactl.errors import UsageError

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

_FRAME = struct.Struct("<I")
MAX_CANDIDATES = 16  # metadata servers one TCP address may name (a leader and its standbys)


def parse_tcp_url(address: str) -> tuple[str, int]:
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise UsageError(f"bad TCP address {address!r}", fix="write tcp://<host>:<port>, e.g. tcp://127.0.0.1:9471")
    return parts.hostname, port


def parse_tcp_candidates(address: str) -> list[tuple[str, int]]:
    """`tcp://a:9471,b:9471` (each item may repeat `tcp://`) -> [(host, port), ...]; UsageError says
    what is wrong (no item, an empty item, a bad one, one named twice, more than MAX_CANDIDATES)."""
    fix = "write tcp://<host>:<port>[,<host>:<port>...], e.g. tcp://10.0.0.1:9471,10.0.0.2:9471"
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise UsageError(f"bad TCP address {address!r}", fix=fix)
    items = address[len("tcp://") :].split(",")
    if len(items) > MAX_CANDIDATES:
        raise UsageError(
            f"TCP address {address[:80]!r}... names {len(items)} metadata servers, at most {MAX_CANDIDATES}", fix=fix
        )
    out: list[tuple[str, int]] = []
    for item in items:
        item = item.strip()
        if not item or item == "tcp://":
            raise UsageError(f"TCP address {address!r} has an empty entry", fix=fix)
        url = item if item.startswith("tcp://") else "tcp://" + item
        parts = urlsplit(url)
        if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            raise UsageError(f"bad entry {item!r} in TCP address {address!r}: a host and port only", fix=fix)
        try:
            hp = parse_tcp_url(url)
        except UsageError:
            raise UsageError(f"bad entry {item!r} in TCP address {address!r}", fix=fix) from None
        if hp in out:
            raise UsageError(f"TCP address {address!r} names {item!r} twice", fix=fix)
        out.append(hp)
    return out


@register_transport
class TcpTransport(ClientTransport):
    """The same messages over TCP, for clients outside the CXL domain and as the benchmark baseline."""

    scheme = "tcp"
    kind = "tcp"
    example = "tcp://<host>:<port>"
    # The server queues at most 4x its buffer limit of replies for a client that has not read them
    # (listener_tcp.py), and each reply is at most one max_payload: three full frames in flight leave
    # a frame of margin.
    max_inflight = 3

    @classmethod
    def open(cls, address: str, *, pool: PoolMapping | None, timeout_s: float) -> TcpTransport:
        candidates = parse_tcp_candidates(address)
        host, port = candidates[0]
        return cls(host, port, timeout_s=timeout_s, credential=auth.client_credential(), candidates=candidates)

    def default_client_id(self) -> int:
        return os.getpid()

    def adopt(self, epoch: int, max_payload: int) -> None:
        # The server's per-connection buffer limit bounds what one frame may carry.
        if 0 < max_payload < self.max_payload:
            self.max_payload = max_payload

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 1.0,
        credential: auth.Credential | None = None,
        key_file: str | None = None,
        candidates: list[tuple[str, int]] | None = None,
    ) -> None:
        self.address = (host, port)
        # The servers to try, in order (one: the address above); `_at`: the one that answered last.
        self.candidates = list(candidates) if candidates else [self.address]
        self._at = self.candidates.index(self.address) if self.address in self.candidates else 0
        self.credential = credential if credential is not None else (
            auth.client_credential(key_file) if key_file else None
        )  # fmt: skip
        self.server_verified = False
        self.max_payload = TCP_MAX_PAYLOAD
        self.timeout_s = timeout_s
        self._seq = random.randrange(1, 1 << 40)
        self._inflight: deque[int] = deque()
        self._rx = bytearray()
        self.broken = True
        self.sock: socket.socket | None = None
        self.reset()

    def advance(self) -> None:
        """The candidate connected now failed (HELLO refused or unanswered): the next connection
        starts at the next candidate."""
        self.broken = True
        self._at = (self._at + 1) % len(self.candidates)

    def reset(self) -> None:
        """Connect afresh: one pass over the candidates from the one that answered last; the first
        that accepts and proves the key (when this client holds one) is kept."""
        errors: list[str] = []
        n = len(self.candidates)
        for i in range(n):
            k = (self._at + i) % n
            self.address = self.candidates[k]
            try:
                self._connect_one()
            except TransportError as exc:
                errors.append(str(exc))
                continue
            self._at = k
            return
        self.broken = True
        if n == 1:
            raise TransportError(errors[0])
        raise TransportError(f"none of the {n} metadata servers named answered: " + "; ".join(errors))

    def _connect_one(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.address[0]}:{self.address[1]}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._inflight.clear()
        self._rx.clear()
        self.server_verified = False
        if self.credential is not None:
            try:
                self._handshake(self.credential)
            except BaseException:
                self.close()
                self.broken = True
                raise
        self.broken = False

    # --- the handshake (rpc/auth.py) ------------------------------------------------------------
    def _auth_send(self, phase: int, body: bytes) -> None:
        assert self.sock is not None
        frame = bytearray(4 + HEADER_SIZE + len(body))
        _FRAME.pack_into(frame, 0, HEADER_SIZE + len(body))
        HEADER.pack_into(frame, 4, 0, 0, auth.AUTH_MAGIC, 0, phase, 0, len(body))
        frame[4 + HEADER_SIZE :] = body
        try:
            self.sock.sendall(frame)
        except OSError as exc:
            raise TransportError(f"handshake with {self._where()} failed: {exc}") from None

    def _auth_recv(self, want: int) -> bytes:
        """The server's next handshake frame of phase `want`; anything else refuses the server."""
        try:
            (size,) = _FRAME.unpack(self._recv_exact(4, self.timeout_s))
            if not HEADER_SIZE <= size <= auth.AUTH_MAX_FRAME:
                raise self._unproven(f"a {size}-byte frame instead of the handshake")
            frame = self._recv_exact(size, self.timeout_s)
        except TransportError as exc:
            if str(exc).startswith("refused the server"):
                raise
            raise self._unproven(f"no handshake answer ({exc})") from None
        _st, _seq, magic, _epoch, phase, code, length = HEADER.unpack_from(frame, 0)
        if magic != auth.AUTH_MAGIC:
            raise self._unproven("an answer that is no handshake (a server without authentication?)")
        if phase == auth.DONE and code != auth.OK:
            raise self._unproven(auth.ANSWERS.get(code, f"handshake answer {code}"))
        if phase != want or code != auth.OK or length != size - HEADER_SIZE:
            raise self._unproven(f"handshake phase {phase} (code {code}) where phase {want} was due")
        return frame[HEADER_SIZE:]

    def _handshake(self, credential: auth.Credential) -> None:
        nc = os.urandom(auth.NONCE_BYTES)
        self._auth_send(auth.HELLO, auth.hello_payload(nc, credential.tenant))
        proof = auth.check_challenge(credential, nc, self._auth_recv(auth.CHALLENGE))
        if proof is None:
            raise self._unproven("a proof made with another key: not this rack's metadata server")
        self._auth_send(auth.PROOF, proof)
        self._auth_recv(auth.DONE)
        self.server_verified = True

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def _unproven(self, what: str) -> TransportError:
        key = self.credential.path if self.credential is not None and self.credential.path else "the key"
        return TransportError(
            f"refused the server at {self._where()}: {what}; nothing was sent to it "
            f"(this client proves {key})"
        )

    def submit(self, op: int, epoch: int, payload: bytes) -> int:
        if self.sock is None:
            raise TransportError("not connected")
        seq = self._seq
        self._seq += 1
        frame = bytearray(4 + HEADER_SIZE + len(payload))
        _FRAME.pack_into(frame, 0, HEADER_SIZE + len(payload))
        HEADER.pack_into(frame, 4, 0, seq, MAGIC, epoch & 0xFFFFFFFF, op, 0, len(payload))
        frame[4 + HEADER_SIZE :] = payload
        try:
            self.sock.sendall(frame)
        except OSError as exc:
            self.broken = True
            raise TransportError(f"send failed: {exc}") from None
        self._inflight.append(seq)
        return seq

    def _recv_exact(self, n: int, timeout_s: float) -> bytes:
        assert self.sock is not None
        self.sock.settimeout(timeout_s)
        while len(self._rx) < n:
            try:
                chunk = self.sock.recv(max(65536, n - len(self._rx)))
            except OSError as exc:  # socket.timeout included
                self.broken = True
                raise TransportError(f"receive failed: {exc or 'timed out'}") from None
            if not chunk:
                self.broken = True
                raise TransportError("the server closed the connection")
            self._rx += chunk
        data = bytes(self._rx[:n])
        del self._rx[:n]
        return data

    def collect(self, timeout_ns: int) -> Reply:
        timeout_s = max(timeout_ns / 1e9, 1e-3)
        (size,) = _FRAME.unpack(self._recv_exact(4, timeout_s))
        if not HEADER_SIZE <= size <= HEADER_SIZE + TCP_MAX_PAYLOAD:
            self.broken = True
            raise TransportError(f"bad frame length {size}")
        frame = self._recv_exact(size, timeout_s)
        _st, seq, magic, epoch, _op, code, length = HEADER.unpack_from(frame, 0)
        if magic == auth.AUTH_MAGIC:
            self.broken = True
            why = auth.ANSWERS.get(code, f"handshake answer {code}")
            raise TransportError(
                f"{self._where()}: {why} (it binds beyond loopback); give this client the rack's key: "
                f"${auth.ENV_KEY_FILE}=<the secret file, or this tenant's key file>"
            )
        expected = self._inflight.popleft() if self._inflight else None
        if magic != MAGIC or seq != expected or length != size - HEADER_SIZE:
            self.broken = True
            raise TransportError(f"malformed reply (magic {magic:#x}, seq {seq} for {expected}, length {length})")
        return code, epoch, frame[HEADER_SIZE:]

    def call(self, op: int, epoch: int, payload: bytes, timeout_ns: int) -> Reply:
        self.submit(op, epoch, payload)
        return self.collect(timeout_ns)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @property
    def pending(self) -> int:
        return len(self._inflight)
