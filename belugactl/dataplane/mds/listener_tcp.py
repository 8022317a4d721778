"""The TCP listener: the same messages, length-prefixed, for clients outside the CXL domain.

Frames are `u32 length` + a 32-byte protocol header + payload. Non-blocking sockets on the
server's selector, so one slow client never stalls the loop (or the CXL rings). Limits, each in
the manifest's `serve.metadata` and a `metadata-server` flag:
- `max_connections`: a connection over the cap is accepted and closed at once (counted);
- `idle_timeout_s`: a connection with no complete request for this long is closed;
- `max_buffered`: the bytes one connection may have buffered toward one frame (a frame longer
  than this is refused and the connection closed); HELLO tells the client the payload this
  leaves, and replies queued for a client that does not read are capped at 4x this;
- `accept_backoff_s`: when accept() fails for lack of descriptors or memory (EMFILE, ENFILE,
  ENOBUFS, ENOMEM) the listening socket leaves the selector for this long instead of spinning.
The owner of a request (token and lease ownership) is a number given to its connection.

No client can hold the loop: one turn serves a connection at most `frames_per_turn` frames or
`bytes_per_turn` bytes of requests. What is left waits in its buffer (the socket is not read
meanwhile, so the buffer stays bounded) and is served on the next turn, after the CXL rings and
every other ready connection had theirs (`serve_backlog`). At the connection cap, a new client
first takes the place of the OLDEST connection that has not settled yet (no HELLO answered OK, no
handshake finished, no work done), whatever its age, silent ones (nothing sent, nothing waiting
to be read) before those whose first bytes are there: silent sockets that reconnect as soon as
they are closed then cycle through the places among themselves, while a newcomer, which says
HELLO at once, is passed over until it has settled. A silent arrival takes only a silent one's
place (it is closed when none is), and the listening socket defers accept() until a connection's
first bytes are there (TCP_DEFER_ACCEPT, `DEFER_ACCEPT_S`; a silent one comes through after that
long): a newcomer is never seen silent, so a flood of silent sockets cannot take its place between
its connect and its HELLO. When every place is
settled, a newcomer takes the place of a connection that has done no work (anything but PING and
HELLO) for `evict_idle_after_s`: one that never worked first, the newest of those first (a
flood's latest arrivals go before a client that held its place). Idle, ping-only and silent
connections cannot lock others out; connections that work keep their places.

Authentication (rpc/auth.py): when the listener binds beyond loopback (or its policy says so) a
connection must finish the handshake before any other frame; until then its frames are capped at
`auth.AUTH_MAX_FRAME` bytes, it has done no work (so it gives way at the cap first), and it is
closed `auth_timeout_s` after it arrived. The handshake is frames like any other, served on the
same non-blocking turns: a client that sends it slowly, or never finishes it, stalls nobody. A
listener with the rack secret also answers a handshake a client offers on loopback (a client that
holds a key verifies the server); with neither, frames are served as before, at no cost per frame.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.mds.listener import Listener, register_listener
from belugactl.dataplane.mds.ownership import TcpOwners
from belugactl.dataplane.mds.service import BATCH_OPS
from belugactl.dataplane.rpc import auth
from belugactl.dataplane.rpc.protocol import HEADER, HEADER_SIZE, MAGIC, TCP_MAX_PAYLOAD, Code, Op
from belugactl.errors import EnvironmentProblem

if TYPE_CHECKING:
    from belugactl.dataplane.mds.server import MetadataServer

_FRAME = struct.Struct("<I")
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
DEFER_ACCEPT_S = 1  # TCP_DEFER_ACCEPT: how long a silent connection waits in the kernel before accept()


@dataclass
class TcpLimits:
    max_connections: int = 256
    idle_timeout_s: float = 300.0
    max_buffered: int = 256 << 10
    accept_backoff_s: float = 0.2
    frames_per_turn: int = 32
    bytes_per_turn: int = 64 << 10
    auth_timeout_s: float = 5.0  # a connection that must authenticate has this long to finish

    @property
    def evict_idle_after_s(self) -> float:
        return min(1.0, self.idle_timeout_s)

    @property
    def max_payload(self) -> int:
        return max(0, min(TCP_MAX_PAYLOAD, self.max_buffered - 4 - HEADER_SIZE))


_NOT_WORK = frozenset((int(Op.PING), int(Op.HELLO)))


class _Conn:
    __slots__ = ("sock", "rx", "tx", "owner", "last_active", "last_work", "worked", "since", "events", "backlogged",
                 "gate", "shake", "settled")  # fmt: skip

    def __init__(self, sock: socket.socket, owner: int, now: float) -> None:
        self.sock = sock
        self.rx = bytearray()
        self.tx = bytearray()  # replies the client has not taken yet
        self.owner = owner
        self.last_active = now
        self.last_work = now  # the last request other than PING/HELLO (who gives way at the cap)
        self.worked = False
        self.since = now
        self.events = 0  # what the selector watches for it
        self.backlogged = False  # complete frames wait for the next turn
        # 0: frames are served; _OFFERED: a handshake may come first; _REQUIRED: it must come first;
        # _PROVING: the challenge is out, the proof must come next.
        self.gate = 0
        self.shake: auth.ServerHandshake | None = None
        self.settled = False  # HELLO answered OK, handshake finished or work done (not displaced first)


_OFFERED, _REQUIRED, _PROVING = 1, 2, 3


@register_listener
class TcpListener(Listener):
    scheme = "tcp"

    def __init__(self, server: MetadataServer, bind: str, port: int, limits: TcpLimits | None = None) -> None:
        super().__init__(server)
        self.bind_address = bind
        self.want_port = port
        self.limits = limits or server.config.tcp
        self.sock: socket.socket | None = None
        self.port: int | None = None
        self.conns: dict[int, _Conn] = {}
        self.owners = TcpOwners(server.geometry.ring_count)
        self._paused_until = 0.0
        self.refused_over_cap = 0
        self.closed_idle = 0
        self.closed_oversize = 0
        self.accept_errors = 0
        self.accept_backoffs = 0
        self.evicted_idle = 0
        # At the cap: connections that had not said HELLO, displaced oldest first (refused_over_cap counts
        # them too: it counts every connection closed for the cap before it settled, at accept or later).
        self.displaced_unsettled = 0
        self.turns_deferred = 0  # turns that ended with frames left for the next one
        self._backlog: dict[int, _Conn] = {}
        # Who must prove a key (decided at bind, from the address and the server's policy).
        self.credential: auth.Credential | None = None
        self.auth_required = False
        self.auth_ok = 0
        self.auth_refused = 0
        self.auth_timed_out = 0
        self.unauthenticated_refused = 0

    @classmethod
    def from_config(cls, server: MetadataServer) -> list[Listener]:
        c = server.config
        out: list[Listener] = [] if c.rpc_port is None else [cls(server, c.rpc_bind, c.rpc_port)]
        return out + super().from_config(server)

    @classmethod
    def from_url(cls, server: MetadataServer, url: str) -> Listener:
        from belugactl.dataplane.rpc.transport_tcp import parse_tcp_url

        host, port = parse_tcp_url(url)
        return cls(server, host, port)

    def bind(self) -> None:
        self.auth_required = self.server.auth_required(self.bind_address)
        self.credential = self.server.rack_credential(self.auth_required)
        self.sock = listen(self.bind_address, self.want_port, "RPC (TCP)")
        # The kernel hands over a connection once its first bytes arrived (or after DEFER_ACCEPT_S of
        # silence): a client that says HELLO at once is never seen silent, so a silent flood cannot take its place.
        with contextlib.suppress(AttributeError, OSError):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_S)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.server.selector.register(self.sock, selectors.EVENT_READ, self._on_listen)

    @property
    def busy(self) -> bool:
        return bool(self.conns)

    @property
    def backlog(self) -> bool:
        """Connections with frames waiting for a turn (and room to queue their replies)."""
        cap = self.limits.max_buffered
        return any(len(c.tx) <= cap for c in self._backlog.values())

    def serve_backlog(self) -> None:
        """One more turn for each connection that had frames left after its last one."""
        cap = self.limits.max_buffered
        for conn in list(self._backlog.values()):
            if len(conn.tx) > cap:
                continue  # its replies wait for the client to read them first
            del self._backlog[id(conn)]
            conn.backlogged = False
            self._turn(conn)

    # --- accept -------------------------------------------------------------------------------
    def _on_listen(self, _events: int) -> None:
        assert self.sock is not None
        try:
            sock, _addr = self.sock.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            self.accept_errors += 1
            if exc.errno in _OUT_OF_DESCRIPTORS:
                self._pause_accepting()
            return
        now = time.monotonic()
        if len(self.conns) >= self.limits.max_connections and not self._make_room(now, _bytes_waiting(sock)):
            self.refused_over_cap += 1
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)  # never let one slow client stall the loop (and the CXL rings)
        conn = _Conn(sock, self.owners.next(), now)
        if self.auth_required:
            conn.gate = _REQUIRED
        elif self.credential is not None:
            conn.gate = _OFFERED
        self.conns[sock.fileno()] = conn
        self._watch(conn)

    def _make_room(self, now: float, speaks: bool = True) -> bool:
        """At the cap: close the oldest connection that has not settled, else an idle one (the docstring).
        `speaks`: the arrival's first bytes are there; a silent arrival takes only a silent one's place."""
        unsettled = sorted((c for c in self.conns.values() if not c.settled), key=lambda c: c.since)
        if not unsettled:
            return self._evict_one_idle(now)
        # A silent one first: a client whose first bytes wait (read or not yet), or that is halfway through
        # the handshake, is saying HELLO.
        victim = next(
            (c for c in unsettled if not c.rx and c.gate != _PROVING and not _bytes_waiting(c.sock)),
            unsettled[0] if speaks else None,
        )
        if victim is None:
            return False
        self.displaced_unsettled += 1
        self.refused_over_cap += 1
        self._drop(victim)
        return True

    def _evict_one_idle(self, now: float) -> bool:
        """At the cap: close a connection that did no work lately (see the module's docstring)."""
        cutoff = now - self.limits.evict_idle_after_s
        idle = [c for c in self.conns.values() if c.last_work <= cutoff]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.worked, -c.since))
        self.evicted_idle += 1
        self._drop(victim)
        return True

    def _watch(self, conn: _Conn) -> None:
        """Watch for what the connection needs: reads unless frames wait for a turn, writes while replies wait."""
        want = (0 if conn.backlogged else selectors.EVENT_READ) | (selectors.EVENT_WRITE if conn.tx else 0)
        if want == conn.events:
            return
        sel = self.server.selector
        with contextlib.suppress(KeyError, ValueError):
            if not conn.events:
                sel.register(conn.sock, want, lambda ev, c=conn: self._on_conn(c, ev))
            elif not want:
                sel.unregister(conn.sock)
            else:
                sel.modify(conn.sock, want, lambda ev, c=conn: self._on_conn(c, ev))
        conn.events = want

    def _pause_accepting(self) -> None:
        """Out of descriptors: stop watching the listening socket for a while (no busy loop)."""
        assert self.sock is not None
        with contextlib.suppress(KeyError, ValueError):
            self.server.selector.unregister(self.sock)
        self._paused_until = time.monotonic() + self.limits.accept_backoff_s
        self.accept_backoffs += 1

    def housekeeping(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until and self.sock is not None:
            self._paused_until = 0.0
            self.server.selector.register(self.sock, selectors.EVENT_READ, self._on_listen)
        limit = self.limits.idle_timeout_s
        for conn in [c for c in self.conns.values() if now - c.last_active > limit]:
            self.closed_idle += 1
            self._drop(conn)
        deadline = now - self.limits.auth_timeout_s
        for conn in [c for c in self.conns.values() if c.gate >= _REQUIRED and c.since < deadline]:
            self.auth_timed_out += 1
            self._drop(conn)

    # --- one connection -----------------------------------------------------------------------
    def _on_conn(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush_tx(conn)
        if events & selectors.EVENT_READ and conn.sock.fileno() >= 0 and not conn.backlogged:
            self._read(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.events:
            with contextlib.suppress(KeyError, ValueError):
                self.server.selector.unregister(conn.sock)
            conn.events = 0
        self._backlog.pop(id(conn), None)
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        # Its owner number may go to a later connection, which must not inherit its hand-over group.
        self.server.service.forget_owner(conn.owner)

    def _flush_tx(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.tx)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        del conn.tx[:sent]
        self._watch(conn)

    def _read(self, conn: _Conn) -> None:
        limits = self.limits
        try:
            data = conn.sock.recv(min(1 << 16, limits.max_buffered))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.rx += data
        self._turn(conn)

    def _turn(self, conn: _Conn) -> None:
        """Serve the complete frames in the connection's buffer, up to one turn's budget."""
        limits = self.limits
        rx = conn.rx
        service = self.server.service
        index = self.server.index
        max_frame = min(HEADER_SIZE + TCP_MAX_PAYLOAD, limits.max_buffered - 4)
        if conn.gate >= _REQUIRED:
            max_frame = auth.AUTH_MAX_FRAME  # no big frame before the handshake
        out = bytearray()
        perf = time.perf_counter
        frames_left = limits.frames_per_turn
        bytes_left = limits.bytes_per_turn
        while len(rx) >= 4:
            if frames_left <= 0 or bytes_left <= 0:
                if len(rx) >= 4 + _FRAME.unpack_from(rx, 0)[0]:  # a complete frame waits: next turn
                    conn.backlogged = True
                    self._backlog[id(conn)] = conn
                    self.turns_deferred += 1
                break
            (size,) = _FRAME.unpack_from(rx, 0)
            if not HEADER_SIZE <= size <= max_frame:
                service.error(Code.BAD_LENGTH)
                self.closed_oversize += 1
                self._drop(conn)  # framing is lost (or the frame is over the limit): close
                return
            if len(rx) < 4 + size:
                break
            frames_left -= 1
            bytes_left -= 4 + size
            _st, seq, magic, epoch, op, _code, length = HEADER.unpack_from(rx, 4)
            payload = bytes(rx[4 + HEADER_SIZE : 4 + size])
            del rx[: 4 + size]
            if conn.gate:
                if not self._gate(conn, magic, op, length, seq, payload, out):
                    return  # refused and closed
                if conn.gate >= _REQUIRED:
                    max_frame = auth.AUTH_MAX_FRAME
                    continue
                max_frame = min(HEADER_SIZE + TCP_MAX_PAYLOAD, limits.max_buffered - 4)
                if magic == auth.AUTH_MAGIC:
                    continue
            t0 = perf()
            if magic != MAGIC:
                code, rep = service.error(Code.BAD_MAGIC)
            elif length != size - HEADER_SIZE:
                code, rep = service.error(Code.BAD_LENGTH)
            else:
                index.begin_request(conn.owner)
                try:
                    code, rep = service.handle(op, epoch, payload, limits.max_payload, conn.owner)
                finally:
                    index.end_request()
                if op not in _NOT_WORK:
                    conn.last_work = time.monotonic()
                    conn.worked = True
                    conn.settled = True
                elif op == Op.HELLO and code == Code.OK:
                    conn.settled = True
                if op in BATCH_OPS:
                    frames_left = 0  # one step of a batch a turn: the other connections and rings go first
            frame = bytearray(4 + HEADER_SIZE + len(rep))
            _FRAME.pack_into(frame, 0, HEADER_SIZE + len(rep))
            HEADER.pack_into(frame, 4, 0, seq, MAGIC, service.epoch32, op & 0xFFFF, code, len(rep))
            frame[4 + HEADER_SIZE :] = rep
            out += frame
            h = service.latency.get(service._names.get(op, ""))
            if h is not None:
                h.observe(perf() - t0)
            self.requests += 1
            conn.last_active = time.monotonic()
        if out:
            conn.tx += out
            if len(conn.tx) > 4 * limits.max_buffered:
                self._drop(conn)  # a client that does not read its replies
                return
            self._flush_tx(conn)
        else:
            self._watch(conn)

    # --- the handshake (rpc/auth.py) ----------------------------------------------------------
    def _gate(self, conn: _Conn, magic: int, op: int, length: int, seq: int, payload: bytes, out: bytearray) -> bool:
        """One frame of a connection that has not finished (or may offer) the handshake. Appends the
        answer to `out`; False when the connection was refused and closed."""
        if magic != auth.AUTH_MAGIC:
            if conn.gate == _OFFERED:
                conn.gate = 0  # no handshake offered: served as before (loopback)
                return True
            self.unauthenticated_refused += 1
            return self._refuse(conn, out, auth.REQUIRED, seq)
        if op == auth.HELLO and conn.gate in (_OFFERED, _REQUIRED) and length == len(payload):
            conn.shake = auth.ServerHandshake(self.credential)
            answer, body = conn.shake.on_hello(payload)
            if answer != auth.OK:
                return self._refuse(conn, out, answer, seq)
            conn.gate = _PROVING
            out += _auth_frame(auth.CHALLENGE, auth.OK, seq, body)
            return True
        if op == auth.PROOF and conn.gate == _PROVING and conn.shake is not None and conn.shake.on_proof(payload):
            tenant = conn.shake.tenant
            conn.gate = 0
            conn.shake = None
            conn.settled = True
            self.auth_ok += 1
            bind_tenant = getattr(self.server.service, "bind_tenant", None)
            if tenant and bind_tenant is not None:
                bind_tenant(conn.owner, tenant)
            out += _auth_frame(auth.DONE, auth.OK, seq, b"")
            return True
        return self._refuse(conn, out, auth.REFUSED, seq)

    def _refuse(self, conn: _Conn, out: bytearray, answer: int, seq: int) -> bool:
        """Say why (best effort, one small frame) and close: nothing else this connection sent is served."""
        if answer == auth.REFUSED:
            self.auth_refused += 1
        with contextlib.suppress(OSError):
            conn.sock.send(bytes(conn.tx) + bytes(out) + _auth_frame(auth.DONE, answer, seq, b""))
        self._drop(conn)
        return False

    def stats(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "bind": self.bind_address,
            "port": self.port,
            "connections": len(self.conns),
            "requests": self.requests,
            "limits": {
                "max_connections": lim.max_connections,
                "idle_timeout_s": lim.idle_timeout_s,
                "max_buffered": lim.max_buffered,
                "accept_backoff_s": lim.accept_backoff_s,
                "frames_per_turn": lim.frames_per_turn,
                "bytes_per_turn": lim.bytes_per_turn,
            },
            "refused_over_cap": self.refused_over_cap,
            "closed_idle": self.closed_idle,
            "closed_oversize": self.closed_oversize,
            "accept_errors": self.accept_errors,
            "accept_backoffs": self.accept_backoffs,
            "evicted_idle": self.evicted_idle,
            "displaced_unsettled": self.displaced_unsettled,
            "turns_deferred": self.turns_deferred,
            "auth": {
                "required": self.auth_required,
                "offered": self.credential is not None,
                "ok": self.auth_ok,
                "refused": self.auth_refused,
                "unauthenticated_refused": self.unauthenticated_refused,
                "timed_out": self.auth_timed_out,
            },
            "buffered_bytes": sum(len(c.rx) + len(c.tx) for c in self.conns.values()),
        }

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._drop(conn)
        if self.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.server.selector.unregister(self.sock)
            self.sock.close()
            self.sock = None


def _bytes_waiting(sock: socket.socket) -> bool:
    """Whether the peer sent bytes the listener has not read yet (a look, nothing taken)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))  # b"": closed, nothing to say
    except OSError:  # nothing waiting (EAGAIN), or the peer is gone: either way it is saying nothing
        return False


def _auth_frame(phase: int, answer: int, seq: int, body: bytes) -> bytes:
    frame = bytearray(4 + HEADER_SIZE + len(body))
    _FRAME.pack_into(frame, 0, HEADER_SIZE + len(body))
    HEADER.pack_into(frame, 4, 0, seq, auth.AUTH_MAGIC, 0, phase, answer, len(body))
    frame[4 + HEADER_SIZE :] = body
    return bytes(frame)


def listen(bind: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise port_problem(bind, port, what, exc) from None
    return sock


def port_problem(bind: str, port: int, what: str, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"cannot listen for {what} on {bind}:{port}: {exc.strerror or exc}",
        why="another process holds the port, or the address is not on this host",
        fix=f"stop the other process (`ss -ltnp 'sport = :{port}'`) or pick another port",
    )
