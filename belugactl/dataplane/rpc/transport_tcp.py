"""The TCP client transport: the same messages, length-prefixed (`tcp://<host>:<port>`)."""

from __future__ import annotations

import os
import random
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, TCP_MAX_PAYLOAD
from belugactl.dataplane.rpc.transport import ClientTransport, Reply, TransportError, register_transport
from belugactl.errors import UsageError

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

_FRAME = struct.Struct("<I")


def parse_tcp_url(address: str) -> tuple[str, int]:
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise UsageError(f"bad TCP address {address!r}", fix="write tcp://<host>:<port>, e.g. tcp://127.0.0.1:9471")
    return parts.hostname, port


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
        host, port = parse_tcp_url(address)
        return cls(host, port, timeout_s=timeout_s)

    def default_client_id(self) -> int:
        return os.getpid()

    def adopt(self, epoch: int, max_payload: int) -> None:
        # The server's per-connection buffer limit bounds what one frame may carry.
        if 0 < max_payload < self.max_payload:
            self.max_payload = max_payload

    def __init__(self, host: str, port: int, *, timeout_s: float = 1.0) -> None:
        self.address = (host, port)
        self.max_payload = TCP_MAX_PAYLOAD
        self.timeout_s = timeout_s
        self._seq = random.randrange(1, 1 << 40)
        self._inflight: deque[int] = deque()
        self._rx = bytearray()
        self.broken = True
        self.sock: socket.socket | None = None
        self.reset()

    def reset(self) -> None:
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
        self.broken = False

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
