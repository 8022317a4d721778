"""Client transports: the CXL slot ring and TCP, both carrying protocol.py messages.

A transport moves one request and its reply; it knows nothing about what the ops mean. Both
offer `call` (one round trip) and `submit`/`collect` (several requests in flight, for the
benchmarks and batched callers). Any failure to get a well-formed reply raises `TransportError`
and marks the transport broken; the client turns that into `MetadataUnavailable`.
"""

from __future__ import annotations

import random
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING

from belugactl.dataplane import native
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import FREE, HEADER, HEADER_SIZE, MAGIC, REQ_READY, TCP_MAX_PAYLOAD

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

Reply = tuple[int, int, bytes]  # (code, server epoch low 32 bits, payload)
FENCED = -1  # call() code: the pool header's epoch moved since the client joined; nothing was sent
_rpc_call = getattr(native._native, "rpc_call", None) if native._native is not None else None
_FRAME = struct.Struct("<I")


class TransportError(Exception):
    pass


class CxlTransport:
    """One client ring in the pool's metadata area."""

    kind = "cxl"

    def __init__(self, pool: PoolMapping, ring: int, *, flush: bool | None = None) -> None:
        g = pool.geometry
        if not 0 <= ring < g.ring_count:
            raise ValueError(f"ring {ring} outside 0..{g.ring_count - 1} (the layout has {g.ring_count} rings)")
        self.pool = pool
        self.ring = ring
        self.buf = pool.buf
        self.flush = pool.needs_flush if flush is None else flush
        self.slots_per_ring = g.slots_per_ring
        self.max_payload = g.slot_size - HEADER_SIZE
        self._offsets = [g.slot_offset(ring, s) for s in range(g.slots_per_ring)]
        self._inflight: deque[int] = deque()
        self.broken = False
        # The epoch the client adopted: a call first checks the header's epoch word against it.
        self.fence_epoch: int | None = None
        from belugactl.pool.header import EPOCH_OFFSET

        self._epoch_off = EPOCH_OFFSET
        self.reset()

    def reset(self) -> None:
        """Take the ring over: every slot FREE, and the next request in slot 0, where the server looks
        for a (re)connecting client."""
        for off in self._offsets:
            native.store64(self.buf, off, FREE, self.flush)
        # A random base (a multiple of the ring size) so a reply left over from an earlier
        # incarnation of this client can never match a sequence number we wait for.
        self._seq = self.slots_per_ring * random.randrange(1, 1 << 40)
        self._inflight.clear()
        self.broken = False

    def submit(self, op: int, epoch: int, payload: bytes) -> int:
        if len(payload) > self.max_payload:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the slot's {self.max_payload}")
        if len(self._inflight) >= self.slots_per_ring:
            raise TransportError("every slot of the ring is in flight")
        seq = self._seq
        off = self._offsets[seq % self.slots_per_ring]
        if native.load64(self.buf, off) == REQ_READY:
            # A slot still busy from a request we gave up on: the ring is out of step with the server.
            # (RESP_READY there is a late reply to an abandoned request: ours to overwrite.)
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        self._seq = seq + 1
        slots.post(self.buf, off, seq, epoch, op, payload, self.flush)
        self._inflight.append(seq)
        return seq

    def collect(self, timeout_ns: int) -> Reply:
        """The reply to the oldest request in flight."""
        seq = self._inflight[0]
        off = self._offsets[seq % self.slots_per_ring]
        try:
            r = slots.wait_reply(self.buf, off, seq, self.max_payload, timeout_ns, self.flush)
        except ValueError as exc:
            self.broken = True
            raise TransportError(str(exc)) from None
        if r is None:
            self.broken = True
            raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
        self._inflight.popleft()
        return r

    def call(self, op: int, epoch: int, payload: bytes, timeout_ns: int) -> Reply:
        """One round trip (the QD1 path, kept short: it is most of a lookup's client-side cost)."""
        if self._inflight:
            self.submit(op, epoch, payload)
            while len(self._inflight) > 1:
                self.collect(timeout_ns)
            return self.collect(timeout_ns)
        if len(payload) > self.max_payload:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the slot's {self.max_payload}")
        seq = self._seq
        off = self._offsets[seq % self.slots_per_ring]
        buf = self.buf
        fence = self.fence_epoch
        if _rpc_call is not None:
            # The whole round trip in one native call, the header epoch check included.
            try:
                r = _rpc_call(buf, off, seq, epoch, op, payload, self.max_payload, timeout_ns, self.flush,
                              self._epoch_off if fence is not None else -1, fence or 0)  # fmt: skip
            except ValueError as exc:
                self.broken = True
                raise TransportError(str(exc)) from None
            if r is None:
                self._seq = seq + 1
                self.broken = True
                raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
            code = r[0]
            if code >= 0:
                self._seq = seq + 1
                return r
            if code == FENCED:
                return r
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        if fence is not None and native.load64(buf, self._epoch_off) != fence:
            return FENCED, 0, b""
        if native.load64(buf, off) == REQ_READY:
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        self._seq = seq + 1
        slots.post(buf, off, seq, epoch, op, payload, self.flush)
        try:
            r = slots.wait_reply(buf, off, seq, self.max_payload, timeout_ns, self.flush)
        except ValueError as exc:
            self.broken = True
            raise TransportError(str(exc)) from None
        if r is None:
            self.broken = True
            raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
        return r

    def status_of_next(self) -> int:
        return native.load64(self.buf, self._offsets[self._seq % self.slots_per_ring])

    def close(self) -> None:
        self._inflight.clear()

    @property
    def pending(self) -> int:
        return len(self._inflight)



class TcpTransport:
    """The same messages over TCP, for clients outside the CXL domain and as the benchmark baseline."""

    kind = "tcp"

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
