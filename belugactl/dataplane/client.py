"""Client library of the KV metadata server (what the vLLM connector codes against).

    from belugactl.dataplane.client import connect
    c = connect("cxl:///dev/dax0.0#3")            # ring 3 of the pool's CXL-RPC area
    c = connect("tcp://127.0.0.1:9471")            # same messages over TCP
    n = c.lookup_prefix("qwen32b/tp0", hashes)     # how many leading blocks are in the pool
    loc = c.get("qwen32b/tp0", hashes[0])          # BlockLocation(extents, lease_id, nbytes, checksum) or None
    locs = c.get_many("qwen32b/tp0", hashes[:n])   # the same for many keys, few round trips
    t = c.start_lookup("qwen32b/tp0", hashes)      # sent now (None: cannot), the answer taken later:
    locs = c.finish_lookup(t)                      # ... as get_many_tuples answers (nowait.py)
    copy_verified(pool.buf, loc, out)              # copy loc.extents out, checking the writer's CRC32C
    c.release([loc.lease_id])                      # -> how many leases it ended
    r = c.reserve("qwen32b/tp0", h, nbytes)        # Reservation(token, extents, nbytes, deadline, epoch)
    if c.writable(r):                              # before each batch of writes (fencing)
        ... write the block into r.extents (flush/non-temporal on a shared pool) ...
    c.commit(r.token, checksum=crc)                # now visible to every client (crc: CRC32C of the block)
    rs = c.reserve_many("qwen32b/tp0", [(h, nbytes) for h in hashes])   # Reservation or a Code per key
    c.commit_many([(r.token, crc) for r, crc in ...])                     # a Code per token (Code.OK: visible)

Semantics (the server's; see docs/dataplane.md):
- Keys are bytes (vLLM block hashes, 1..255 bytes), inside a namespace string (model, layout, TP rank).
- `reserve` hands out extents in the shared KV area; the block is invisible until `commit`. A
  reservation not committed within the server's reservation TTL (30 s by default) is reclaimed and
  a late `commit` raises `ReservationExpired`. `abort` gives the space back at once.
- Fencing: write into a reservation only while `writable(r)` is true (checked before each batch):
  past its deadline (90 % of the server's writer window after the request was sent) or once the
  pool's epoch moved, abandon it (`abort`, ignoring errors). See docs/dataplane.md, "Fencing".
- Ownership: tokens and lease ids are bound to the ring or connection that got them; another
  client's COMMIT/ABORT/RELEASE raises `NotOwner` and changes nothing. A release with
  `granted_elsewhere=True` ends leases another client passed on, only if both said the same
  `handover_group` when they connected.
- `lookup_prefix` and `get` grant read leases (10 s by default): a leased block is never evicted or
  freed, so its bytes stay valid while you copy them. `release` ends leases early; they also expire.
  A block deleted while leased disappears from lookups at once and is freed when its leases end.
- Errors (all `MetadataError`, a `BelugaError`): `MetadataUnavailable` (server down, not ready, or
  no reply within `timeout_s`), `PoolFull`, `StaleEpoch` (the server restarted: every lease id and
  reservation token you hold is void; call `reconnect()`), `AlreadyPresent`, `ReservationExpired`,
  `RequestRejected` (malformed request). A best-effort caller treats any `MetadataError` as a miss.
- Checksums: `commit(token, checksum=crc)` stores the CRC32C of the block's bytes (extent order);
  it is required (the server refuses a commit without one: NO_CHECKSUM). `get`/`get_many` return it
  as `BlockLocation.checksum`, and `copy_verified` copies a block out while checking it, raising
  `CorruptBlock` on a mismatch (a stalled writer overwrote the extents after they were reused;
  docs/dataplane.md, "Checksums") or when a location carries no checksum (never trusted).
- Batches: `reserve_many` / `commit_many` / `abort_many` do what the single calls do for a whole
  set of keys or tokens in one message per slot's worth (RESERVE_MANY, COMMIT_MANY), the messages of
  one call sent as one pipelined burst; they answer per key/token instead of raising. After the
  first key refused for lack of space (Code.POOL_FULL) every later key is refused too. Against a
  server without these requests they fall back to one request per key. `round_trips` and
  `messages` count what this client sent (a burst is one round trip while it fits the transport's
  in-flight window).
- One client object is not thread-safe; give each thread (or vLLM process) its own ring/connection.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from belugactl.dataplane import native, nowait
from belugactl.dataplane.metadata_errors import (
    AlreadyPresent,
    CorruptBlock,
    MetadataError,
    MetadataUnavailable,
    NotOwner,
    PoolFull,
    RequestRejected,
    ReservationExpired,
    StaleEpoch,
)
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.dataplane.rpc.transport import FENCED, ClientTransport, TransportError, transport_for

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

Extent = tuple[int, int]  # (pool offset, length in bytes)
_LOOKUP = int(Op.LOOKUP_PREFIX)
_LOOKUP_HDR = struct.Struct("<IHH")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class BlockLocation:
    """Where a committed block lives: extents in pool offsets (in order), and the read lease held on it."""

    extents: list[Extent]
    lease_id: int
    nbytes: int
    checksum: int | None = None  # CRC32C its writer committed (None: an unverifiable location, refused)


# A located block as get_many_tuples returns it: (extents, lease id, nbytes, checksum or None).
LocationTuple = p.LocationTuple
# What the no-wait requests return (defined in nowait.py, with the code that makes them).
PendingLookup = nowait.PendingLookup
CopyRelease = nowait.CopyRelease


@dataclass(frozen=True)
class Removal:
    """A key the server removed: `why` is "evicted", "deleted" or "cleared"."""

    namespace_id: int
    key: bytes
    why: str


@dataclass(frozen=True)
class Removals:
    """One REMOVALS answer. Ask again with `next_cursor`; `caught_up` once it reached `head`. `lost`:
    removals at or after the cursor asked with that the server's bounded log no longer held.
    `epoch`: the server epoch the cursors belong to (they mean nothing under another one)."""

    items: list[Removal]
    next_cursor: int
    head: int
    lost: int
    epoch: int

    @property
    def caught_up(self) -> bool:
        return self.next_cursor >= self.head


@dataclass(frozen=True)
class Reservation:
    """Space reserved for one block: write `nbytes` across `extents` (in order), then commit(token).

    Writes are allowed only before `deadline` (time.monotonic()) and under `epoch`: see
    `KVIndexClient.writable`.
    """

    token: int
    extents: list[Extent]
    nbytes: int
    deadline: float = float("inf")
    epoch: int = 0


def copy_verified(pool: object, loc: BlockLocation, dst: object, dst_off: int = 0, *, key: bytes = b"") -> int:
    """Copy the block at `loc` out of `pool` (a buffer over the whole pool) into `dst` at `dst_off`,
    checking its CRC32C in the same pass; returns the bytes copied.

    Raises CorruptBlock when the bytes differ from what their writer committed (then `dst` holds
    them: do not use it), or before any byte moves when `loc` carries no checksum (no server
    commits a block without one: such a location cannot be verified, so it is not trusted).
    """
    if loc.checksum is None:
        raise CorruptBlock(
            f"block {key.hex() or '?'}: its location carries no checksum",
            why="every committed block carries its writer's CRC32C; this answer cannot be verified",
            fix="treat the block as a miss; check that the metadata server is a current belugactl",
        )
    crc = 0
    left = loc.nbytes
    pos = dst_off
    for off, length in loc.extents:
        if left <= 0:
            break
        take = min(length, left)
        crc = native.copy_crc32c(dst, pos, pool, off, take, crc)
        pos += take
        left -= take
    if left > 0:
        raise CorruptBlock(
            f"block {key.hex() or '?'}: its extents hold fewer than {loc.nbytes} bytes",
            why="the server's location is inconsistent",
            fix="treat the block as a miss",
        )
    if crc != loc.checksum:
        raise CorruptBlock(
            f"block {key.hex() or '?'}: CRC32C {crc:08x} of its bytes is not the {loc.checksum:08x} "
            "its writer committed",
            why="its extents were overwritten after the commit (a writer stalled past its deadline)",
            fix="treat the block as a miss and delete the key; the next save writes it afresh",
        )
    return loc.nbytes


# A writer stops at this fraction of the server's writer window: the server reclaims only after
# the whole window from when it granted, which is after the client sent; the rest is clock slack.
WRITER_WINDOW_SHARE = 0.9
# A reader trusts a read lease by time alone for this fraction of the lease TTL the server announced
# in HELLO, from before it sent the request that took the lease (the server starts counting later).
# Half leaves room for clock rate differences between hosts and a late look at the clock.
LEASE_TRUST_SHARE = 0.5


def connect(
    address: str,
    *,
    pool: PoolMapping | None = None,
    client_id: int | None = None,
    timeout_s: float = 1.0,
    handover_group: int = 0,
    tenant: str = "",
    failover_s: float | None = None,
) -> KVIndexClient:
    """Connect to the metadata server and learn its epoch.

    `address` is "cxl://<pool path>#<ring index>" or "tcp://host:port" (any scheme registered in
    rpc/transport.py). For CXL, pass an open `pool` to share one mapping (otherwise the pool path is
    mapped here, geometry from its header). Over TCP, pass the `pool` the caller writes into and
    reads from: the client then holds the server to it as a CXL client is held (`use_pool`).
    Raises MetadataUnavailable when the server does not answer within `timeout_s` (or answers with
    another epoch than the pool header's), UsageError for a malformed address.

    `handover_group`: a 64-bit secret this client shares with the clients it passes leases to or
    takes them from (the processes of one vLLM instance); a `granted_elsewhere` release is accepted
    only for leases granted to a client of the same group. 0: none.

    `tenant`: the manifest tenant this client is of (said in HELLO; "" the implicit one). A CXL ring's
    tenant is its instance's, from the manifest; a TCP connection's is this one (or the one its
    authentication proved). A server answers NOT_OWNER to a name that is not the ring's or the
    connection's, and QUOTA when the tenant holds its connections.

    Candidates (TCP): "tcp://a:9471,b:9471" names the rack's elected leader and its standbys (at
    most 16; only the leader listens). On a connection error, a closed connection, or a HELLO that
    fails (unanswered, NOT_READY, another pool's epoch), the client moves to the next candidate,
    pausing 0.05 s doubling to 0.5 s between passes, and gives up `failover_s` after the failure
    (default: `timeout_s` for a list, 0 for one address: one pass, as before). A lookup or get
    (OPEN_NS, LOOKUP_PREFIX, GET, GET_MANY, STATS, PING, REMOVALS) whose connection broke is sent
    again once the client joined a server of the same epoch; after a failover (a new epoch) it
    raises StaleEpoch instead, the client already joined to the new leader (its next call is
    answered). A RESERVE, COMMIT, ABORT, RELEASE or DELETE is never sent twice.
    """
    cls = transport_for(address)
    listed = address.startswith("tcp://") and "," in address
    failover = max(0.0, float(failover_s)) if failover_s is not None else (timeout_s if listed else 0.0)
    deadline = time.monotonic() + failover
    pause, tries = FAILOVER_FIRST_PAUSE_S, 0
    while True:
        tries += 1
        try:
            transport = cls.open(address, pool=pool, timeout_s=timeout_s)
            break
        except TransportError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                why = str(exc) if tries == 1 else f"{exc} (gave up after {tries} tries in {failover:g} s)"
                raise MetadataUnavailable(
                    f"metadata server at {address} is unreachable",
                    why=why,
                    fix="start it: belugactl metadata-server -f rack.yaml",
                ) from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, FAILOVER_MAX_PAUSE_S)
    cid = transport.default_client_id() if client_id is None else client_id
    client = KVIndexClient(transport, address=address, client_id=cid, timeout_s=timeout_s)
    client.handover_group = handover_group
    client.tenant = tenant
    client.failover_s = failover
    if transport.pool is None and pool is not None:
        client.use_pool(pool)
    try:
        client.rejoin()
    except BaseException:
        client.close()
        raise
    return client


# Requests that change nothing a retry could do twice: sent again after the connection broke, when
# the client joined a server of the same epoch (connect's doc).
_RESENDABLE = frozenset(
    int(o) for o in (Op.OPEN_NS, Op.LOOKUP_PREFIX, Op.GET, Op.GET_MANY, Op.STATS, Op.PING, Op.REMOVALS)
)
FAILOVER_FIRST_PAUSE_S = 0.05
FAILOVER_MAX_PAUSE_S = 0.5


class KVIndexClient:
    def __init__(
        self,
        transport: ClientTransport,
        *,
        address: str,
        client_id: int,
        timeout_s: float,
    ) -> None:
        self.transport = transport
        self.address = address
        self.client_id = client_id
        self.handover_group = 0  # sent in HELLO: whose leases this client may release (connect's doc)
        self.tenant = ""  # sent in HELLO: the manifest tenant this client is of (connect's doc)
        self.timeout_s = timeout_s
        self.failover_s = 0.0  # how long a request may look for a server among the candidates (connect's doc)
        self.failovers = 0  # times this client joined a server after its connection failed
        self._timeout_ns = int(timeout_s * 1e9)
        self.epoch = 0
        self._epoch32 = 0
        self._ns: dict[str, int] = {}
        self._stale = False
        self._pool = transport.pool
        # The shared KV area [start, end) of the pool header: every extent a reply names must lie in
        # it (one elsewhere, e.g. over the header, is refused before a byte is written or read).
        # Unknown (no pool mapped by this client) until `use_pool`.
        self.kv_area: p.Area = p.ANYWHERE if self._pool is None else _kv_area(self._pool)
        self.writer_window_s = 0.0  # from HELLO: how long a writer may use a reservation
        self.lease_ttl_s = 0.0  # from HELLO: how long a read lease lives at least (0: unknown)
        # No-wait requests (nowait.py) whose replies are not taken yet, oldest first: for a RELEASE
        # message the lease count its reply should report, for a lookup its PendingLookup. They
        # are taken before this client's next request.
        self._pending_replies: deque[int | nowait.PendingLookup] = deque()
        self.nowait_leases_ended = 0  # leases a no-wait RELEASE found ended already (expired)
        self.nowait_refused = 0  # no-wait RELEASE messages the server refused (or answered malformed)
        self._lookup_cap: dict[int, int] = {}
        self._release_cap: dict[int, int] = {}  # max payload -> lease ids a RELEASE message carries
        self._get_many_cap: dict[tuple[int, int], int] = {}  # (max payload, key length): keys a message
        # What this client sent: requests, and waits for replies (a pipelined burst waits once per
        # in-flight window). The connector reports them per saved request.
        self.messages = 0
        self.round_trips = 0
        self._batches = True  # False once the server answered BAD_OP to a batched request (an older one)
        self.batch_items = 0  # keys or tokens a batched request carries at most, as the server's HELLO said

    # --- connection ---------------------------------------------------------------------------
    def reconnect(self) -> int:
        """(Re)join the server: reset the ring or socket, adopt the server's epoch; return it.

        Call after StaleEpoch (having dropped every lease id and token) or MetadataUnavailable.
        """
        t = self.transport
        try:
            if t.broken or self._stale or self.epoch:
                nowait.drop_replies(self, "the client reconnected: the reply went with the old ring or socket")
                t.reset()
            t.forget_epoch()  # HELLO is how we learn the new epoch
            hello = p.encode_hello(self.client_id, 0, self.handover_group, self.tenant)
            code, _e, payload = t.call(Op.HELLO, 0, hello, self._timeout_ns)
        except TransportError as exc:
            raise self._unavailable(str(exc)) from None
        if code != Code.OK:
            name = Code(code).name if code in Code._value2member_map_ else str(code)
            if code in (Code.QUOTA, Code.NOT_OWNER):  # the server answered: it refuses this client's tenant
                raise MetadataUnavailable(
                    f"metadata server at {self.address} refused HELLO: {name}",
                    why="QUOTA: this tenant holds its connections quota; NOT_OWNER: the tenant named is not this "
                    "client's (a ring's is its instance's, an authenticated connection's the one it proved)",
                    fix="check the manifest's tenants (belugactl pool show -f rack.yaml) and this client's tenant",
                )
            raise self._unavailable(f"HELLO answered {name}")
        epoch, _pid, max_payload, window_ms, lease_ms = p.decode_hello_reply(payload)
        if self._pool is not None:
            # A server that is not this pool's (a process that bound the port while the real one
            # restarted) cannot know the header's epoch word: refuse it before any request.
            header_epoch = self._pool.epoch()
            if epoch != header_epoch:
                t.broken = True  # nothing more is asked of it: the next call connects afresh
                raise self._unavailable(
                    f"it answered epoch {epoch}, the pool header's epoch word is {header_epoch}: "
                    "not the metadata server of this pool (or it restarted just now)"
                )
        t.adopt(epoch, max_payload)
        self.batch_items = p.decode_hello_batch(payload)  # 0: an older server, batches sized by payload only
        self.writer_window_s = (window_ms or p.DEFAULT_WRITER_WINDOW_MS) / 1000
        self.lease_ttl_s = lease_ms / 1000
        self.epoch = epoch
        self._epoch32 = epoch & 0xFFFFFFFF
        self._ns.clear()
        self._stale = False
        self._batches = True
        return epoch

    def rejoin(self) -> int:
        """`reconnect()`, trying the transport's candidates in turn with a bounded backoff until
        `failover_s` has passed (one try when it is 0); MetadataUnavailable names the last failure."""
        deadline = time.monotonic() + self.failover_s
        pause = FAILOVER_FIRST_PAUSE_S
        tries = 0
        while True:
            tries += 1
            try:
                return self.reconnect()
            except MetadataUnavailable as exc:
                if "refused HELLO" in exc.what:  # the server answered: it refuses this tenant
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    if tries > 1:
                        exc.why = f"{exc.why} (gave up after {tries} tries in {self.failover_s:g} s)"
                    raise
                advance = getattr(self.transport, "advance", None)
                if advance is not None:
                    advance()  # the candidate that failed HELLO is not asked first again
                else:
                    self.transport.broken = True
                time.sleep(min(pause, left))
                pause = min(pause * 2, FAILOVER_MAX_PAUSE_S)

    def _resend_after(self, op: int, exc: TransportError) -> None:
        """The connection broke under a request: return when it may be sent again (a resendable
        op, rejoined at the same epoch); otherwise raise what the caller should see."""
        if op not in _RESENDABLE or self.failover_s <= 0:
            raise self._unavailable(str(exc)) from None
        old = self.epoch
        self.transport.broken = True
        self.rejoin()  # MetadataUnavailable past failover_s
        self.failovers += 1
        if old and self.epoch != old:
            raise StaleEpoch(
                "the metadata server changed (a failover or restart: new pool epoch)",
                why="leases and reservations from before are void",
                fix="drop every lease id and reservation token; this client has joined the new server",
            )

    def use_pool(self, pool: PoolMapping) -> None:
        """Hold this client's server to `pool` (the mapping its caller copies through): extents
        outside its shared KV area are refused, and the next HELLO must answer its epoch word."""
        self._pool = pool
        self.kv_area = _kv_area(pool)

    def _outside(self, extents: Sequence[Extent], op: int) -> MetadataUnavailable | None:
        """The error for a reply naming an extent outside the shared KV area (None: all inside).
        Such a server is not this pool's: the connection is dropped, and the caller writes nothing."""
        bad = p.extents_outside(extents, self.kv_area)
        if bad is None:
            return None
        self.transport.broken = True  # the next request reconnects (and checks the epoch again)
        lo, hi = self.kv_area
        return self._unavailable(
            f"its {Op(op).name} reply names extent {bad}, outside the shared KV area [{lo}, {hi}) of the pool "
            "header: not the metadata server of this pool; nothing was written or read"
        )

    def _unavailable(self, why: str) -> MetadataUnavailable:
        return MetadataUnavailable(
            f"metadata server at {self.address} did not answer",
            why=why,
            fix="check `belugactl status` / the server's /readyz; the caller should treat this as a cache miss",
        )

    def _before_call(self) -> None:
        if self._pending_replies and not self.transport.broken:
            self.collect_replies()
        if self._stale:
            raise StaleEpoch("the metadata server restarted", fix="drop leases and tokens, then call reconnect()")
        if self.transport.broken:
            old = self.epoch
            self.rejoin()  # raises MetadataUnavailable, or adopts the server's epoch
            if old and self.epoch != old:
                raise StaleEpoch(
                    "the metadata server restarted (new pool epoch)",
                    why="leases and reservations from before the restart are void",
                    fix="drop every lease id and reservation token; this client has reconnected",
                )

    def _call(self, op: int, payload: bytes) -> bytes:
        self._before_call()
        self.messages += 1
        self.round_trips += 1
        try:
            code, _epoch, reply = self.transport.call(op, self._epoch32, payload, self._timeout_ns)
        except TransportError as exc:
            self._resend_after(op, exc)
            self.messages += 1
            self.round_trips += 1
            try:
                code, _epoch, reply = self.transport.call(op, self._epoch32, payload, self._timeout_ns)
            except TransportError as again:
                raise self._unavailable(str(again)) from None
        if code == 0:
            return reply
        if code == FENCED:
            # The header's epoch word moved: the server restarted. The CXL transport checks it
            # (one 8-byte load) before sending, so we are fenced without a round trip.
            code = Code.STALE_EPOCH
        raise self._error(code, op)

    def _call_many(self, op: int, payloads: Sequence[bytes]) -> list[bytes]:
        """Send several requests as one pipelined burst (up to the transport's in-flight window) and
        return their replies in order. Every reply is collected before an error is raised, so the
        transport stays in step; the first failed request's error is raised."""
        if len(payloads) == 1:
            return [self._call(op, payloads[0])]
        self._before_call()
        t = self.transport
        self._check_fence(op)
        window = max(1, t.max_inflight)
        try:
            try:
                replies = t.call_many(op, self._epoch32, payloads, self._timeout_ns)
            except TransportError as exc:
                self._resend_after(op, exc)
                replies = t.call_many(op, self._epoch32, payloads, self._timeout_ns)
        except TransportError as exc:
            raise self._unavailable(str(exc)) from None
        finally:
            self.messages += len(payloads)
            self.round_trips += -(-len(payloads) // window)
        for code, _epoch, _reply in replies:
            if code:
                raise self._error(code, op)
        return [reply for _code, _epoch, reply in replies]

    def _check_fence(self, op: int) -> None:
        """The pool header's epoch moved (CXL): fenced without a round trip, as `_call` is."""
        current = self.transport.current_epoch()
        if current is not None and self.epoch and current != self.epoch:
            raise self._error(Code.STALE_EPOCH, op)

    def _error(self, code: int, op: int) -> Exception:
        name = Code(code).name if code in Code._value2member_map_ else str(code)
        op_name = Op(op).name if op in Op._value2member_map_ else str(op)
        what = f"{op_name} failed: {name}"
        if code == Code.STALE_EPOCH:
            self._stale = True
            return StaleEpoch(
                "the metadata server restarted (new pool epoch)",
                why="leases and reservations from before the restart are void",
                fix="drop every lease id and reservation token, then call reconnect()",
            )
        if code == Code.NOT_READY:
            return self._unavailable("the server is starting (fencing grace period)")
        if code == Code.UNKNOWN_NS:
            self._ns.clear()  # the server dropped an idle empty namespace: the next call opens it again
        if code == Code.POOL_FULL:
            return PoolFull(what, why="no space in the shared KV area, even after eviction")
        if code == Code.QUOTA:
            exc = PoolFull(what, why="this client's tenant holds its quota (manifest tenants: quotas)")
            exc.code = code  # type: ignore[attr-defined]
            return exc
        if code == Code.EXISTS:
            return AlreadyPresent(what, why="the key is committed, or another client is writing it")
        if code == Code.NOT_OWNER:
            return NotOwner(what, why="the token or lease was granted to another ring or connection")
        if code == Code.NO_RESERVATION:
            return ReservationExpired(what, why="the reservation timed out and was reclaimed, or was never issued")
        if code == Code.NO_CHECKSUM:
            exc = RequestRejected(what, why="the commit carried no CRC32C of the block", fix="commit(token, crc)")
            exc.code = code  # type: ignore[attr-defined]
            return exc
        if code == Code.TOO_BIG:
            return PoolFull(what, why="the extents do not fit one reply slot (pool too fragmented or block too large)")
        exc = RequestRejected(what)
        exc.code = code  # type: ignore[attr-defined]
        return exc

    def _ns_id(self, namespace: str) -> int:
        ns = self._ns.get(namespace)
        if ns is None:
            ns = p.decode_u32(self._call(Op.OPEN_NS, p.encode_name(namespace)), "OPEN_NS reply")
            self._ns[namespace] = ns
        return ns

    # --- index operations ---------------------------------------------------------------------
    def lookup_prefix(self, namespace: str, keys: Sequence[bytes]) -> int:
        """How many leading keys of this chain are committed. Grants read leases on them (TTL)."""
        if len(keys) == 1:  # the scheduler's common one-key lookup: skip the chunking machinery
            ns = self._ns.get(namespace) or self._ns_id(namespace)
            key = keys[0]
            reply = self._call(_LOOKUP, _LOOKUP_HDR.pack(ns, 1, len(key)) + key)
            if len(reply) < 4:
                raise RequestRejected("short LOOKUP_PREFIX reply")
            return _U32.unpack_from(reply, 0)[0]
        return self.lookup_prefix_leased(namespace, keys)[0]

    def lookup_prefix_leased(self, namespace: str, keys: Sequence[bytes]) -> tuple[int, list[int]]:
        """Like lookup_prefix, also returning the lease ids granted (release them when done)."""
        if not keys:
            return 0, []
        ns = self._ns_id(namespace)
        per_call = self._lookup_cap.get(len(keys[0]))
        if per_call is None:
            per_call = self._lookup_cap[len(keys[0])] = p.lookup_capacity(self.transport.max_payload, len(keys[0]))
        if per_call < 1:
            raise RequestRejected(f"a {len(keys[0])}-byte key does not fit one request slot")
        # Every chunk goes out in one pipelined burst (one round trip whatever the chain's length,
        # where chunk after chunk cost one each: 21 for a 4000-token prompt in 256 B slots). The
        # prefix ends at the first chunk found short; leases granted on chunks after it cover no
        # block of the prefix and are handed back at once.
        chunks = [keys[start : start + per_call] for start in range(0, len(keys), per_call)]
        replies = self._call_many(Op.LOOKUP_PREFIX, [p.encode_lookup(ns, chunk) for chunk in chunks])
        total = 0
        leases: list[int] = []
        beyond: list[int] = []
        short = False
        for chunk, reply in zip(chunks, replies, strict=True):
            count, lease = p.decode_lookup_reply(reply)
            if short:
                if lease:
                    beyond.append(lease)
                continue
            total += count
            if lease:
                leases.append(lease)
            short = count < len(chunk)
        if beyond:
            with contextlib.suppress(Exception):  # they expire on their own; this only frees them sooner
                self.release(beyond)
        return total, leases

    def get(self, namespace: str, key: bytes) -> BlockLocation | None:
        ns = self._ns_id(namespace)
        try:
            reply = self._call(Op.GET, p.encode_key(ns, key))
        except RequestRejected as exc:
            if getattr(exc, "code", None) == Code.NOT_FOUND:
                return None
            raise
        lease, nbytes, extents, checksum = p.decode_get_reply_ex(reply)
        if self.kv_area is not p.ANYWHERE and (bad := self._outside(extents, Op.GET)) is not None:
            raise bad
        return BlockLocation(extents, lease, nbytes, checksum)

    def get_many(self, namespace: str, keys: Sequence[bytes]) -> list[BlockLocation | None]:
        """`get` for several keys (same length) in as few round trips as the transport allows.

        One entry per key, in order: a BlockLocation (with its own lease) or None when absent.
        """
        return [None if t is None else BlockLocation(*t) for t in self.get_many_tuples(namespace, keys)]

    def get_many_tuples(self, namespace: str, keys: Sequence[bytes]) -> list[LocationTuple | None]:
        """`get_many` as plain (extents, lease id, nbytes, checksum) tuples: what the vLLM connector
        keeps, without an object per block in between (its scheduler looks a long prompt up on a
        pool hit's critical path)."""
        if not keys:
            return []
        ns = self._ns_id(namespace)
        shape = (self.transport.max_payload, len(keys[0]))
        per_call = self._get_many_cap.get(shape)
        if per_call is None:
            per_call = self._get_many_cap[shape] = p.get_many_capacity(*shape)
        out: list[LocationTuple | None] = [None] * len(keys)
        todo = range(len(keys))
        if self.transport.can_get_many_in_one_call:
            # The whole burst, encoded and decoded, in one native call (CXL rings).
            self._before_call()
            self._check_fence(Op.GET_MANY)
            try:
                got = self.transport.get_many(self._epoch32, ns, keys, per_call, self._timeout_ns)
            except TransportError as exc:
                raise self._unavailable(str(exc)) from None
            if got is not None:
                sent = -(-len(keys) // per_call)
                self.messages += sent
                self.round_trips += -(-sent // max(1, self.transport.max_inflight))
                out, todo = self._get_many_answer(got)
        # All the messages go out as one pipelined burst; a reply that could not carry every key of
        # its message (many extents) answers a prefix, and the rest goes out in the next burst.
        while todo:
            chunks = [list(todo[i : i + per_call]) for i in range(0, len(todo), per_call)]
            replies = self._call_many(Op.GET_MANY, [p.encode_lookup(ns, [keys[j] for j in c]) for c in chunks])
            left: list[int] = []
            for chunk, reply in zip(chunks, replies, strict=True):
                items = p.decode_get_many_tuples(reply, self.kv_area)  # in C when the native helper is built
                if not items or len(items) > len(chunk):
                    raise RequestRejected(f"GET_MANY answered {len(items)} of {len(chunk)} keys")
                for j, loc in zip(chunk, items, strict=False):
                    out[j] = loc
                left += chunk[len(items) :]
            todo = left
        return out

    def _get_many_answer(self, got: tuple) -> tuple[list[LocationTuple | None], list[int]]:
        """The native GET_MANY burst's result (`rpc_get_many`, `rpc_get_many_finish`): the locations
        and the indices of keys no reply carried; a refused or malformed answer raises."""
        code, located, *rest = got
        if code == -3:
            raise p.ProtocolError(Code.BAD_LENGTH, str(located))
        if code == -4:
            raise RequestRejected(str(located))
        if code:
            raise self._error(code, Op.GET_MANY)
        return located, rest[0]

    def reserve(self, namespace: str, key: bytes, nbytes: int) -> Reservation:
        ns = self._ns_id(namespace)
        asked = time.monotonic()  # before sending: the server's clock for this reservation starts later
        token, extents = p.decode_reserve_reply(self._call(Op.RESERVE, p.encode_reserve(ns, key, nbytes)))
        if (bad := self._outside(extents, Op.RESERVE)) is not None:
            raise bad
        return Reservation(token, extents, nbytes, asked + WRITER_WINDOW_SHARE * self.writer_window_s, self.epoch)

    def reserve_many(self, namespace: str, items: Sequence[tuple[bytes, int]]) -> list[Reservation | Code]:
        """`reserve` for several (key, nbytes) pairs of one namespace, in few messages sent as one burst.

        One entry per item, in order: a Reservation, or the Code that refused that key:
        Code.EXISTS (committed already, or another client is writing it: skip it), Code.POOL_FULL
        (no space even after eviction; every key after the first such one is refused too, so the
        caller never holds reservations past a hole in its chain), Code.TOO_BIG (its extents fit no
        reply). Errors of the whole request (server away, stale epoch, a malformed request) raise as
        for `reserve`. Deadlines count from before the first message was sent.
        """
        if not items:
            return []
        ns = self._ns_id(namespace)
        if self._batches:
            try:
                out = self._reserve_batched(ns, items)
            except RequestRejected as exc:
                if getattr(exc, "code", None) != Code.BAD_OP:
                    raise
                self._batches = False  # a server from before RESERVE_MANY: one request per key
            else:
                return self._refuse_after_full(out)
        return self._reserve_each(namespace, items)

    def _reserve_batched(self, ns: int, items: Sequence[tuple[bytes, int]]) -> list[Reservation | Code]:
        asked = time.monotonic()  # before sending: the server's clock for these reservations starts later
        deadline = asked + WRITER_WINDOW_SHARE * self.writer_window_s
        out: list[Reservation | Code | None] = [None] * len(items)
        todo = list(range(len(items)))
        max_payload = self.transport.max_payload
        while todo:
            key_lens = [len(items[i][0]) for i in todo]
            chunks = _chunks(todo, key_lens, lambda klen: self._batch_cap(p.reserve_many_capacity(max_payload, klen)))
            payloads = [p.encode_reserve_many(ns, [items[i] for i in chunk]) for chunk in chunks]
            rest: list[int] = []
            for chunk, reply in zip(chunks, self._call_many(Op.RESERVE_MANY, payloads), strict=True):
                answered = p.decode_reserve_many_reply(reply)
                if not answered or len(answered) > len(chunk):
                    raise RequestRejected(f"RESERVE_MANY answered {len(answered)} of {len(chunk)} keys")
                for _i, (code, _token, extents) in zip(chunk, answered, strict=False):
                    if code == 0 and (bad := self._outside(extents, Op.RESERVE_MANY)) is not None:
                        raise bad  # before any reservation is handed out: the caller writes nothing
                for i, (code, token, extents) in zip(chunk, answered, strict=False):
                    if code == 0:
                        out[i] = Reservation(token, extents, items[i][1], deadline, self.epoch)
                    elif code in Code._value2member_map_:
                        out[i] = Code(code)
                    else:
                        raise RequestRejected(f"RESERVE_MANY answered unknown code {code}")
                rest.extend(chunk[len(answered) :])  # did not fit the reply: ask again
            todo = rest
        return out  # type: ignore[return-value] - every slot was filled

    def _batch_cap(self, fits: int) -> int:
        """Items a batched request carries: what fits its payload, and no more than the server's step."""
        return min(fits, self.batch_items) if self.batch_items else fits

    def _refuse_after_full(self, out: list[Reservation | Code]) -> list[Reservation | Code]:
        """The rule the server applies within a request, over the whole burst: past the first key
        refused for lack of space, reservations granted by later requests are given back."""
        first = next((i for i, r in enumerate(out) if r is Code.POOL_FULL or r is Code.QUOTA), None)
        if first is None:
            return out
        late = [i for i in range(first + 1, len(out)) if isinstance(out[i], Reservation)]
        if late:
            with contextlib.suppress(MetadataError):  # unreturned space is reclaimed after its TTL anyway
                self.abort_many([out[i].token for i in late])  # type: ignore[union-attr]
            for i in late:
                out[i] = Code.POOL_FULL
        return out

    def _reserve_each(self, namespace: str, items: Sequence[tuple[bytes, int]]) -> list[Reservation | Code]:
        out: list[Reservation | Code] = []
        full = False
        for key, nbytes in items:
            if full:
                out.append(Code.POOL_FULL)
                continue
            try:
                out.append(self.reserve(namespace, key, nbytes))
            except AlreadyPresent:
                out.append(Code.EXISTS)
            except PoolFull:
                out.append(Code.POOL_FULL)
                full = True
        return out

    def commit_many(self, items: Sequence[tuple[int, int]]) -> list[Code]:
        """`commit` of several (token, CRC32C) pairs in few messages sent as one burst, in
        order; a Code per token: Code.OK (visible now), Code.NO_RESERVATION (reclaimed or never
        issued), Code.NOT_OWNER (another client's token: left alone)."""
        return self.finish_many(items, ())[0]

    def abort_many(self, tokens: Sequence[int]) -> list[Code]:
        """`abort` of several tokens in few messages; a Code per token, as for `commit_many`."""
        return self.finish_many((), tokens)[1]

    def finish_many(self, commits: Sequence[tuple[int, int]], aborts: Sequence[int]) -> tuple[list[Code], list[Code]]:
        """Commit some (token, CRC32C) reservations and abort others in one burst; a Code per token
        of each. A commit without a checksum raises ValueError before anything is sent."""
        entries = [(t, c, p.COMMIT_MANY_COMMIT) for t, c in commits] + [(t, None, p.COMMIT_MANY_ABORT) for t in aborts]
        if not entries:
            return [], []
        codes: list[Code] | None = None
        if self._batches:
            try:
                codes = self._finish_batched(entries)
            except RequestRejected as exc:
                if getattr(exc, "code", None) != Code.BAD_OP:
                    raise
                self._batches = False
        if codes is None:
            codes = [self._finish_one(t, c, a) for t, c, a in entries]
        return codes[: len(commits)], codes[len(commits) :]

    def _finish_batched(self, entries: list[tuple[int, int | None, int]]) -> list[Code]:
        per = max(1, self._batch_cap(p.commit_many_capacity(self.transport.max_payload)))
        chunks = [entries[i : i + per] for i in range(0, len(entries), per)]
        payloads = [p.encode_commit_many(chunk) for chunk in chunks]
        codes: list[Code] = []
        for chunk, reply in zip(chunks, self._call_many(Op.COMMIT_MANY, payloads), strict=True):
            got = p.decode_codes_reply(reply, "COMMIT_MANY reply")
            want = len(chunk)
            if len(got) != want or any(c not in Code._value2member_map_ for c in got):
                raise RequestRejected(f"COMMIT_MANY answered {len(got)} codes for {want} tokens")
            codes.extend(Code(c) for c in got)
        return codes

    def _finish_one(self, token: int, checksum: int | None, action: int) -> Code:
        try:
            if action == p.COMMIT_MANY_ABORT:
                self.abort(token)
            else:
                self.commit(token, checksum)
        except ReservationExpired:
            return Code.NO_RESERVATION
        except NotOwner:
            return Code.NOT_OWNER
        return Code.OK

    def writable(self, r: Reservation) -> bool:
        """May the caller (still) write into `r`'s extents? Check before each batch of writes.

        False once its deadline passed or the server restarted (the pool's epoch moved, read from
        the pool header where the transport can see it): the server may hand the extents to
        someone else, so abandon the reservation without writing.
        """
        if time.monotonic() >= r.deadline or self._stale or r.epoch != self.epoch:
            return False
        current = self.transport.current_epoch()
        return current is None or current == r.epoch

    def commit(self, token: int, checksum: int) -> None:
        """Make the block visible. `checksum`: the CRC32C of its `nbytes` bytes in extent order
        (native.crc32c / copy_crc32c), which readers check. Required: ValueError without one."""
        self._call(Op.COMMIT, p.encode_commit(token, checksum))

    def abort(self, token: int) -> None:
        self._call(Op.ABORT, p.encode_u64(token))

    def release(self, lease_ids: Sequence[int], *, granted_elsewhere: bool = False) -> int:
        """End leases early; returns how many were still live (one that expired counts 0: its
        block may have been evicted and its extents reused, so bytes copied under it are suspect).

        Raises NotOwner if one of them was granted to another ring or connection (that request's
        leases are then left alone), unless `granted_elsewhere`: the client that got them passed them
        on (the vLLM scheduler to a worker) and this client is done with them.
        """
        return self.release_groups([lease_ids], granted_elsewhere=granted_elsewhere)[0]

    def release_groups(self, groups: Sequence[Sequence[int]], *, granted_elsewhere: bool = False) -> list[int]:
        """`release` for several sets of leases in one burst, with each set's live count apart (a
        load's own leases, whose count says whether its bytes can be trusted, beside spare ones)."""
        payloads: list[bytes] = []
        owner: list[int] = []  # the group of each payload
        for g, lease_ids in enumerate(groups):
            for _count, payload in self._release_payloads([i for i in lease_ids if i], granted_elsewhere):
                payloads.append(payload)
                owner.append(g)
        live = [0] * len(groups)
        if not payloads:
            return live
        # One pipelined burst, as a load's other messages: a 124-block load's leases fill 5 slots,
        # and 5 round trips one after another sat on the load's path.
        for g, reply in zip(owner, self._call_many(Op.RELEASE, payloads), strict=True):
            live[g] += p.decode_u32(reply, "RELEASE reply")
        return live

    def _release_payloads(self, ids: Sequence[int], granted_elsewhere: bool) -> list[tuple[int, bytes]]:
        """RELEASE messages for `ids` (no zeros), as many ids each as a message holds: (count, payload)."""
        per_call = max(1, p.release_capacity(self.transport.max_payload))
        flags = p.RELEASE_GRANTED_ELSEWHERE if granted_elsewhere else 0
        return [
            (len(ids[i : i + per_call]), p.encode_release(ids[i : i + per_call], flags))
            for i in range(0, len(ids), per_call)
        ]

    def lease_trusted_until(self, asked: float) -> float | None:
        """Until when (time.monotonic) the leases of a request sent after `asked` are certainly
        live, whatever the server does meanwhile; None when the server did not say its TTL.

        A lease ends only when its TTL ran out on the server's clock, counted from when the server
        granted it, which is after the request left (a deleted or evicted block's extents are not
        reused while it is leased). A reader that finished its copy before this needs no live count
        from its RELEASE, and can send it without waiting for the reply (`release_nowait`)."""
        if self.lease_ttl_s <= 0:
            return None
        return asked + LEASE_TRUST_SHARE * self.lease_ttl_s

    # --- no-wait requests: sent now, their replies taken later (nowait.py holds them) ----------
    start_lookup = nowait.start_lookup  # (namespace, keys) -> PendingLookup | None
    finish_lookup = nowait.finish_lookup  # (pending) -> list[LocationTuple | None]
    release_nowait = nowait.release_nowait  # (lease_ids, *, granted_elsewhere=False) -> bool
    release_with_copy = nowait.release_with_copy  # (lease_ids, *, granted_elsewhere=False) -> CopyRelease | None
    collect_replies = nowait.collect_replies  # (until=None): take the pending replies now

    @property
    def replies_pending(self) -> int:
        """No-wait requests (RELEASE messages, lookups) whose replies were not taken yet."""
        return len(self._pending_replies)

    def delete(self, namespace: str, key: bytes) -> bool:
        """True if the key was present."""
        ns = self._ns_id(namespace)
        try:
            self._call(Op.DELETE, p.encode_key(ns, key))
        except RequestRejected as exc:
            if getattr(exc, "code", None) == Code.NOT_FOUND:
                return False
            raise
        return True

    def clear_namespace(self, namespace: str) -> int:
        """Remove every block of a namespace; returns how many."""
        ns = self._ns_id(namespace)
        return p.decode_u64(self._call(Op.CLEAR_NS, p.encode_u32(ns)), "CLEAR_NS reply")

    def stats(self) -> dict:
        return p.decode_stats(self._call(Op.STATS, b""))

    def removals_since(self, cursor: int, namespace: str | None = None, *, max_items: int = 0xFFFF) -> Removals:
        """Keys the server removed (evicted, deleted, cleared) from sequence number `cursor` on, of
        `namespace` (None: every namespace), as many as one reply carries. Start with the `head` of
        a head query (`max_items=0`) to follow from now, or 0 for everything the server still keeps.

        A cursor belongs to the epoch it came from (`Removals.epoch`): after a server restart
        (StaleEpoch, then reconnect) start again from a head query. RequestRejected (BAD_ARGS) for a
        cursor past the server's head."""
        ns = 0 if namespace is None else self._ns_id(namespace)
        epoch = self.epoch
        reply = self._call(Op.REMOVALS, p.encode_removals(cursor, ns, max_items))
        next_cursor, head, lost, raw = p.decode_removals_reply(reply)
        items = [Removal(n, key, p.REMOVAL_WHY.get(why, str(why))) for n, why, key in raw]
        return Removals(items, next_cursor, head, lost, epoch)

    def ping(self, payload: bytes = b"") -> bytes:
        return self._call(Op.PING, payload)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> KVIndexClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kv_area(pool: PoolMapping) -> p.Area:
    g = pool.geometry
    return g.shared_kv_offset, g.shared_kv_offset + g.shared_kv_size


def _chunks(todo: list[int], key_lens: list[int], capacity) -> list[list[int]]:  # noqa: ANN001 - a callable
    """Cut `todo` (indexes into a request's items) into runs of one key length, each as long as one
    message allows (`capacity(key_len)` items); RequestRejected when a key cannot fit a message."""
    chunks: list[list[int]] = []
    cur: list[int] = []
    cur_len = -1
    cap = 0
    for i, klen in zip(todo, key_lens, strict=True):
        if klen != cur_len or len(cur) >= cap:
            if cur:
                chunks.append(cur)
            cur, cur_len = [], klen
            cap = capacity(klen)
            if cap < 1:
                raise RequestRejected(f"a {klen}-byte key does not fit one request message")
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks
