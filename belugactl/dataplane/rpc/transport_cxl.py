"""The CXL-RPC client transport: one client ring in the pool's metadata area (`cxl://<pool>#<ring>`)."""

from __future__ import annotations

import random
import weakref
from array import array
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from belugactl.dataplane import native
from belugactl.dataplane.rpc import slots
from belugactl.dataplane.rpc.protocol import FREE, HEADER_SIZE, REQ_READY
from belugactl.dataplane.rpc.transport import FENCED, ClientTransport, Reply, TransportError, register_transport
from belugactl.errors import UsageError

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

_rpc_call = native.optional("rpc_call")
_rpc_call_many = native.optional("rpc_call_many")
_rpc_get_many = native.optional("rpc_get_many")
_rpc_release_nowait = native.optional("rpc_release_nowait")
_rpc_get_many_start = native.optional("rpc_get_many_start")
_rpc_get_many_finish = native.optional("rpc_get_many_finish")
_bell_register = native.optional("bell_register")
_bell_unregister = native.optional("bell_unregister")
# A native burst copies every reply into private memory before building the list: bursts are cut
# to keep that copy bounded.
_BURST_REPLY_BYTES = 16 << 20


def parse_cxl_url(address: str) -> tuple[str, int]:
    parts = urlsplit(address)
    path = (parts.netloc + parts.path) if parts.netloc else parts.path
    if parts.scheme != "cxl" or not path or not parts.fragment.isdigit():
        raise UsageError(
            f"bad CXL-RPC address {address!r}", fix="write cxl://<pool path>#<ring>, e.g. cxl:///dev/dax0.0#3"
        )
    return path, int(parts.fragment)


@register_transport
class CxlTransport(ClientTransport):
    """One client ring in the pool's metadata area."""

    scheme = "cxl"
    kind = "cxl"
    example = "cxl://<pool path>#<ring>"
    owned_pool: PoolMapping | None = None
    # In one native call when the helper is built (each method answers None when it is not).
    can_get_many_in_one_call = True
    can_start_lookups = True
    can_release_in_one_call = True

    @classmethod
    def open(cls, address: str, *, pool: PoolMapping | None, timeout_s: float) -> CxlTransport:
        path, ring = parse_cxl_url(address)
        owned = None
        if pool is None:
            from belugactl.pool.mapping import PoolMapping

            pool = owned = PoolMapping.open(path)
        try:
            t = cls(pool, ring)
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        t.owned_pool = owned
        return t

    def default_client_id(self) -> int:
        return self.ring

    def forget_epoch(self) -> None:
        self.fence_epoch = None

    def adopt(self, epoch: int, max_payload: int) -> None:
        self.fence_epoch = epoch

    def current_epoch(self) -> int | None:
        return self.pool.epoch()

    def __init__(self, pool: PoolMapping, ring: int, *, flush: bool | None = None) -> None:
        g = pool.geometry
        if not 0 <= ring < g.ring_count:
            raise ValueError(f"ring {ring} outside 0..{g.ring_count - 1} (the layout has {g.ring_count} rings)")
        self.pool = pool
        self.ring = ring
        self.buf = pool.buf
        self.flush = pool.needs_flush if flush is None else flush
        self.slots_per_ring = g.slots_per_ring
        self.max_inflight = g.slots_per_ring
        self.max_payload = g.slot_size - HEADER_SIZE
        self._offsets = [g.slot_offset(ring, s) for s in range(g.slots_per_ring)]
        self._inflight: deque[int] = deque()
        # The slot offsets as int64s, for the native bursts (they never change).
        self._offsets_buf = b"".join(off.to_bytes(8, "little", signed=True) for off in self._offsets)
        # The shared KV area from the header: the native decoders refuse a location outside it.
        self._area = (g.shared_kv_offset, g.shared_kv_offset + g.shared_kv_size)
        self.broken = False
        # The epoch the client adopted: a call first checks the header's epoch word against it.
        self.fence_epoch: int | None = None
        from belugactl.pool.header import EPOCH_OFFSET

        self._epoch_off = EPOCH_OFFSET
        # The ring's doorbell: every request the native helper publishes in this ring's slots bumps
        # it (publish() in _native_ring.h finds it by the slot's address), so the server looks at
        # this ring only when it has something. Without it (no native helper, no doorbell area) the
        # server's sweep still answers, slowly.
        self._bell: weakref.finalize | None = None
        if _bell_register is not None and g.has_doorbells:
            h = _bell_register(self.buf, g.ring_offset(ring), g.slots_per_ring * g.slot_size, g.doorbell_offset(ring))
            if h >= 0:
                self._bell = weakref.finalize(self, _bell_unregister, h)
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
        if self.flush:  # the server's last write to this slot may be in memory, not in our cached line
            native.flush(self.buf, off, 8, True)
        if native.load64(self.buf, off) == REQ_READY:
            # A slot still busy from a request we gave up on: the ring is out of step with the server.
            # (RESP_READY there is a late reply to an abandoned request: ours to overwrite.)
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        self._seq = seq + 1
        slots.send(self.buf, off, seq, epoch, op, payload, self.flush)
        self._inflight.append(seq)
        return seq

    def collect(self, timeout_ns: int) -> Reply:
        """The reply to the oldest request in flight."""
        seq = self._inflight[0]
        r = self._wait_reply(self._offsets[seq % self.slots_per_ring], seq, timeout_ns)
        self._inflight.popleft()
        return r

    def _wait_reply(self, off: int, seq: int, timeout_ns: int) -> Reply:
        """Take request `seq`'s reply from the slot at `off`; a malformed or missing one breaks the ring."""
        try:
            r = slots.wait_reply(self.buf, off, seq, self.max_payload, timeout_ns, self.flush)
        except ValueError as exc:
            self.broken = True
            raise TransportError(str(exc)) from None
        if r is None:
            self.broken = True
            raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
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
        slots.send(buf, off, seq, epoch, op, payload, self.flush)
        return self._wait_reply(off, seq, timeout_ns)

    def call_many(self, op: int, epoch: int, payloads: Sequence[bytes], timeout_ns: int) -> list[Reply]:
        """The burst in one native call per up-to-16-MiB of replies: the GIL is taken back once per
        call, not once per reply (the difference beside a busy thread, see _native_ring.c)."""
        if _rpc_call_many is None or self._inflight:
            return super().call_many(op, epoch, payloads, timeout_ns)
        for pl in payloads:
            if len(pl) > self.max_payload:
                raise ValueError(f"payload of {len(pl)} bytes exceeds the slot's {self.max_payload}")
        per_call = max(1, _BURST_REPLY_BYTES // max(1, self.max_payload))
        replies: list[Reply] = []
        for start in range(0, len(payloads), per_call):
            part = payloads[start : start + per_call]
            seq = self._seq
            try:
                r = _rpc_call_many(self.buf, self._offsets_buf, seq, epoch, op, part, self.max_payload,
                                   self.max_inflight, timeout_ns, self.flush)  # fmt: skip
            except ValueError as exc:
                self._seq = seq + len(part)
                self.broken = True
                raise TransportError(str(exc)) from None
            if r is None:
                self._seq = seq + len(part)
                self.broken = True
                raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
            if isinstance(r, tuple):  # (-2, sent): a slot still busy from an abandoned request
                self.broken = True
                raise TransportError("ring slot still busy from an abandoned request")
            self._seq = seq + len(part)
            replies += r
        return replies

    def get_many(
        self, epoch: int, ns: int, keys: Sequence[bytes], per_message: int, timeout_ns: int
    ) -> tuple[int, Any, Any] | tuple[int, Any] | None:
        """A GET_MANY lookup of `keys` (`per_message` to a message) encoded, sent as one burst and
        decoded in one native call (`rpc_get_many` in _native_ring.c): what a vLLM scheduler's pool
        hit waits for, without the Python around the burst. Returns what that call returns,
        (0, locations, unanswered key indices) or (code, message index) for a refused message, or
        (-3 / -4, why) for a reply that is not a GET_MANY answer; None when this transport cannot
        (no native helper, requests in flight, a burst larger than one native call takes, keys of
        several lengths): nothing was sent, and the caller uses `call_many`. Raises TransportError
        where `call_many` does."""
        if _rpc_get_many is None or self._inflight or not keys:
            return None
        messages = -(-len(keys) // max(1, per_message))
        if messages > max(1, _BURST_REPLY_BYTES // max(1, self.max_payload)):
            return None
        seq = self._seq
        try:
            r = _rpc_get_many(self.buf, self._offsets_buf, seq, epoch, ns, keys, per_message, self.max_payload,
                              self.max_inflight, timeout_ns, self.flush, *self._area)  # fmt: skip
        except TypeError:
            return None  # keys of several lengths, or too long for a slot: nothing was sent
        except ValueError as exc:  # a malformed reply slot: nothing of this ring can be trusted now
            self._seq = seq + messages
            self.broken = True
            raise TransportError(str(exc)) from None
        if r is None:
            self._seq = seq + messages
            self.broken = True
            raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
        if r[0] == -2:  # a slot still busy from an abandoned request
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        self._seq = seq + messages
        return r

    def start_get_many(self, epoch: int, ns: int, keys: Sequence[bytes], per_message: int) -> int | None:
        """The first half of `get_many`: the GET_MANY messages for `keys` encoded and sent in one
        native call (`rpc_get_many_start`), their replies left in flight for `finish_get_many`.
        Returns the first message's sequence number; None when this transport cannot (no native
        helper, more messages than the ring has free slots, keys of several lengths): nothing was
        sent. Raises TransportError for a slot still busy from an abandoned request."""
        if _rpc_get_many_start is None or _rpc_get_many_finish is None or not keys:
            return None
        free = self.max_inflight - len(self._inflight)
        if free < 1:
            return None
        seq = self._seq
        try:
            r = _rpc_get_many_start(self.buf, self._offsets_buf, seq, epoch, ns, keys, per_message, self.max_payload,
                                    free, self.flush)  # fmt: skip
        except TypeError:
            return None
        if r is None:
            return None
        sent = r[1] if isinstance(r, tuple) else r
        self._inflight.extend(range(seq, seq + sent))
        self._seq = seq + sent
        if isinstance(r, tuple):
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        return seq

    def finish_get_many(
        self, seq: int, nkeys: int, per_message: int, timeout_ns: int
    ) -> tuple[int, Any, Any] | tuple[int, Any]:
        """The second half: the replies of the lookup `start_get_many` sent from `seq`, which must
        be the oldest requests in flight, taken and decoded in one native call. Returns what
        `get_many` returns; raises TransportError where it does (the ring is then broken)."""
        messages = -(-nkeys // max(1, per_message))
        # Its messages went out as consecutive sequences: the oldest in flight must be its first.
        if len(self._inflight) < messages or self._inflight[0] != seq:
            raise ValueError("finish_get_many: that lookup's replies are not the next ones in flight")
        try:
            r = _rpc_get_many_finish(self.buf, self._offsets_buf, seq, nkeys, per_message, self.max_payload,
                                     timeout_ns, self.flush, *self._area)  # fmt: skip
        except ValueError as exc:  # a malformed reply slot: nothing of this ring can be trusted now
            self.broken = True
            raise TransportError(str(exc)) from None
        if r is None:
            self.broken = True
            raise TransportError(f"no reply within {timeout_ns / 1e9:.3f} s")
        for _ in range(messages):
            self._inflight.popleft()
        return r

    def release_nowait(
        self, epoch: int, lease_ids: Sequence[int] | array, flags: int, per_message: int
    ) -> list[int] | int | None:
        """RELEASE messages for `lease_ids` (ints, or an array('Q')) `per_message` to a message,
        encoded and sent in one native call (`rpc_release_nowait`), their replies left in flight:
        what a vLLM worker sends right after a pool hit's copy. Returns the ids in each message
        sent; FENCED when the pool's epoch moved since `adopt` (checked in the same call: nothing
        was sent); None when this transport cannot (no native helper): nothing was sent, the
        caller submits them itself. The caller keeps within `max_inflight`. Raises TransportError
        for a slot still busy from an abandoned request (the ring is out of step)."""
        args = self.release_args(epoch, lease_ids, flags, per_message)
        if args is None:
            return None
        return self.account_release(args[2], _rpc_release_nowait(*args))

    def release_args(
        self, epoch: int, lease_ids: Sequence[int] | array, flags: int, per_message: int, messages: int = 0
    ) -> tuple[Any, ...] | None:
        """rpc_release_nowait's arguments for sending `lease_ids` at this ring's next sequence, for
        a caller whose own native call sends them (the one-call load, `load_blocks_checked`, right
        after its copy): None without the native helper. With `messages`, that many sequences are
        taken now, as if sent (the call after the copy then needs no bookkeeping): `unreserve`
        gives back those it did not send. Nothing else may use this transport until then."""
        if _rpc_release_nowait is None:
            return None
        seq = self._seq
        fence = self.fence_epoch
        if messages:
            self._inflight.extend(range(seq, seq + messages))
            self._seq = seq + messages
        return (self.buf, self._offsets_buf, seq, epoch, lease_ids, flags, per_message, self.max_payload,
                self.flush, self._epoch_off if fence is not None else -1, fence or 0)  # fmt: skip

    def unreserve(self, seq: int, reserved: int, sent: int) -> None:
        """Give back the sequences `release_args` took from `seq` that were not sent (the newest
        in flight): the ring goes on from the first one not used."""
        for _ in range(reserved - sent):
            self._inflight.pop()
        self._seq = seq + sent

    def account_release(self, seq: int, r: Any) -> list[int] | int:
        """What a no-wait release (from `seq`) sent: its messages' replies are now in flight.
        Returns the ids in each message sent, or FENCED; raises TransportError for a slot still
        busy from an abandoned request."""
        if isinstance(r, tuple) and r[0] == FENCED:
            return FENCED  # the pool's epoch moved: nothing was sent
        counts = r if r.__class__ is list else r[1]
        self._inflight.extend(range(seq, seq + len(counts)))
        self._seq = seq + len(counts)
        if counts is not r:
            self.broken = True
            raise TransportError("ring slot still busy from an abandoned request")
        return counts

    def status_of_next(self) -> int:
        return native.load64(self.buf, self._offsets[self._seq % self.slots_per_ring])

    def close(self) -> None:
        self._inflight.clear()
        if self._bell is not None:
            self._bell()  # before the mapping can go: publish() must never bump a byte of a closed one
        if self.owned_pool is not None:
            self.owned_pool.close()
            self.owned_pool = None

    @property
    def pending(self) -> int:
        return len(self._inflight)
