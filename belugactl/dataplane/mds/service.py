"""Request dispatch: one decoded request in, one result code and reply payload out.

Transport-free, so the CXL slot poller and the TCP listener share it and tests can drive it with
raw bytes. Every failure of an untrusted request becomes an error reply and a counter; nothing a
client sends can raise out of `handle`.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable

from belugactl.dataplane.mds.index import IndexError_, KVIndex
from belugactl.dataplane.mds.ownership import HandoverGroups, LeaseCodec
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op, ProtocolError

# Latency buckets in seconds, for the Prometheus histogram (1 us .. 100 ms).
LATENCY_BUCKETS: tuple[float, ...] = (
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2, 1e-1,
)  # fmt: skip


class LatencyHistogram:
    """Bucket counts kept as plain ints: the hot path cannot afford a lock per observation."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        # int64 arrays so the native fast path can count into the same buckets.
        self.bounds_ns = array("q", [round(b * 1e9) for b in bounds])
        self.counts = array("q", [0] * (len(bounds) + 1))
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.n += 1


_HELLO = int(Op.HELLO)
# Keys or tokens one RESERVE_MANY or COMMIT_MANY should carry (told to clients in HELLO's reply): a
# step of at most this many keeps the loop's pause bounded (each item is some 10-25 us of Python),
# and the listeners let the other rings and connections go before the next step.
BATCH_ITEMS = 64
# The batch opcodes after which a listener lets the others go first.
BATCH_OPS = frozenset((int(Op.RESERVE_MANY), int(Op.COMMIT_MANY)))
_LOOKUP_HDR = struct.Struct("<IHH")


class MetadataService:
    def __init__(
        self, index: KVIndex, *, epoch: int, ready: bool = True, leases: LeaseCodec | None = None
    ) -> None:
        self.index = index
        # Lease ids on the wire are leases.encode(sequence, owner); the index counts in sequences.
        self.leases = leases or LeaseCodec()
        # Set by fencing: RESERVE answers NOT_READY while an earlier epoch's writers may still write.
        self.reserve_blocked = ""
        self.on_reserve: Callable[[], None] | None = None  # fencing records the writers' deadline
        self.released_granted_elsewhere = 0  # leases released by a client another one passed them to
        # Who may release whose leases on their behalf: owners that said the same secret group in HELLO.
        self.groups = HandoverGroups()
        # How long a writer may write into a reservation, from before it asked (HELLO tells it).
        self.writer_window_ms = int(index.config.reservation_ttl_s * 1000)
        # How long a read lease lives at least, from before its request was sent (HELLO tells readers:
        # one that finished its copy within that trusts its bytes without waiting for RELEASE's count).
        self.lease_ttl_ms = int(index.config.lease_ttl_s * 1000)
        self.epoch = epoch
        self.epoch32 = epoch & 0xFFFFFFFF
        # A plain flag (the server flips it when the fencing grace ends): checked on every request.
        self.ready = ready
        self._op_counts = [0] * (max(Op) + 1)
        self.errors: dict[str, int] = {}
        self.requests = 0
        self.error_count = 0
        self.latency: dict[str, LatencyHistogram] = {o.name: LatencyHistogram() for o in Op}
        # The same histograms indexed by opcode, for the hot path.
        self.latency_by_op: list[LatencyHistogram | None] = [None] * (max(Op) + 1)
        for o in Op:
            self.latency_by_op[o] = self.latency[o.name]
        self.pid = os.getpid()
        names = {int(o): o.name for o in Op}
        self._names = names
        self._dispatch: dict[int, Callable[[memoryview | bytes, int, int], tuple[int, bytes]]] = {
            Op.HELLO: self._hello,
            Op.OPEN_NS: self._open_ns,
            Op.LOOKUP_PREFIX: self._lookup,
            Op.GET: self._get,
            Op.RESERVE: self._reserve,
            Op.COMMIT: self._commit,
            Op.ABORT: self._abort,
            Op.RELEASE: self._release,
            Op.DELETE: self._delete,
            Op.CLEAR_NS: self._clear,
            Op.STATS: self._stats,
            Op.PING: self._ping,
            Op.GET_MANY: self._get_many,
            Op.RESERVE_MANY: self._reserve_many,
            Op.COMMIT_MANY: self._commit_many,
            Op.REMOVALS: self._removals,
        }
        self.batched_items = 0  # keys and tokens carried by RESERVE_MANY / COMMIT_MANY requests
        # Owners below this are CXL rings (their tenant comes from the manifest); set by the server.
        self.rings = 0
        self.tenant_refused = 0  # HELLOs naming a tenant other than the bound one, or an unknown one

    def forget_owner(self, owner: int) -> None:
        """A connection closed: its owner number may be given to another one, which must not
        inherit its hand-over group or its tenant (listeners call this when they drop a connection)."""
        self.groups.forget(owner)
        self.index.tenants.forget(owner)

    def bind_tenant(self, owner: int, tenant: str) -> bool:
        """An authentication (listener_tcp.py's handshake) proved that `owner` is `tenant`'s: from now
        on the connection is that tenant's, and a HELLO naming another tenant is refused (NOT_OWNER).
        False: no such tenant (the manifest names none by that name); nothing changes."""
        tenants = self.index.tenants
        t = tenants.by_name.get(tenant)
        if t is None or not tenant:
            return False
        tenants.bound[owner] = t
        tenants.assign(owner, t)
        return True

    def _join_tenant(self, owner: int, name: str) -> Code:
        """HELLO's tenant: the one it names (trusted unless an authentication bound the connection),
        else the bound one, else the implicit tenant. A TCP connection counts in its tenant's
        connections (rings belong to their instance's tenant, from the manifest, whatever they say)."""
        tenants = self.index.tenants
        if owner < self.rings:
            mine = tenants.of(owner)
            if name and name != mine.name:
                self.tenant_refused += 1
                return Code.NOT_OWNER
            return Code.OK
        bound = tenants.bound.get(owner)
        if bound is not None:
            if name and name != bound.name:
                self.tenant_refused += 1
                return Code.NOT_OWNER  # authenticated as one tenant, claiming another
            t = bound
        elif name:
            t = tenants.by_name.get(name)
            if t is None:
                self.tenant_refused += 1
                return Code.NOT_OWNER  # a tenant the manifest does not name
        else:
            t = tenants.default
        counted = tenants.counted.get(owner)
        if counted is not t:
            if t.connections >= t.max_connections:
                t.refused["connections"] += 1
                return Code.QUOTA
            if counted is not None:
                counted.connections -= 1
            t.connections += 1
            tenants.counted[owner] = t
        tenants.assign(owner, t)
        return Code.OK

    def error(self, code: Code) -> tuple[int, bytes]:
        self.error_count += 1
        self.errors[code.name] = self.errors.get(code.name, 0) + 1
        return int(code), b""

    def handle(
        self, op: int, req_epoch: int, payload: memoryview | bytes, max_reply: int, owner: int = 0
    ) -> tuple[int, bytes]:
        """Serve one request from `owner` (its ring or connection); never raises for anything the client controls."""
        self.requests += 1
        fn = self._dispatch.get(op)
        if fn is None:
            return self.error(Code.BAD_OP)
        self._op_counts[op] += 1
        index = self.index
        if index.tenants.named:
            index.tenant = index.tenants.of(owner)
        if op != _HELLO:
            if req_epoch != self.epoch32:
                return self.error(Code.STALE_EPOCH)
            if not self.ready:
                return self.error(Code.NOT_READY)
        try:
            code, reply = fn(payload, max_reply, owner)
        except ProtocolError as exc:
            return self.error(exc.code)
        except IndexError_ as exc:
            return self.error(Code[exc.code])
        if len(reply) > max_reply:
            return self.error(Code.TOO_BIG)
        if code:
            self.error_count += 1
            name = Code(code).name
            self.errors[name] = self.errors.get(name, 0) + 1
        return code, reply

    # --- handlers -----------------------------------------------------------------------------
    def _hello(self, data, max_reply: int, owner: int) -> tuple[int, bytes]:
        p.decode_hello(data)
        refused = self._join_tenant(owner, p.decode_hello_tenant(data))
        if refused:
            return int(refused), b""
        self.index.tenant = self.index.tenants.of(owner)
        self.groups.join(owner, p.decode_hello_group(data))
        return 0, p.encode_hello_reply(
            self.epoch, self.pid, max_reply, self.writer_window_ms, self.lease_ttl_ms, BATCH_ITEMS
        )

    def _open_ns(self, data, _max: int, _owner: int) -> tuple[int, bytes]:
        return 0, p.encode_u32(self.index.open_namespace(p.decode_name(data)))

    def _lease_id(self, seq: int, owner: int) -> int:
        return self.leases.encode(seq, owner) if seq else 0

    def _lookup(self, data, _max: int, owner: int) -> tuple[int, bytes]:
        # The hot request: a one-key lookup skips the general decoder's list building.
        if len(data) >= 8:
            ns, count, klen = _LOOKUP_HDR.unpack_from(data, 0)
            if count == 1 and 0 < klen <= p.MAX_KEY and len(data) >= 8 + klen:
                count, lease = self.index.lookup_prefix(ns, (bytes(data[8 : 8 + klen]),))
                return 0, p.encode_lookup_reply(count, self._lease_id(lease, owner))
        ns, keys = p.decode_lookup(data)
        count, lease = self.index.lookup_prefix(ns, keys)
        return 0, p.encode_lookup_reply(count, self._lease_id(lease, owner))

    def _get(self, data, max_reply: int, owner: int) -> tuple[int, bytes]:
        ns, key = p.decode_key(data, "GET")
        found = self.index.get(ns, key)
        if found is None:
            return int(Code.NOT_FOUND), b""
        entry, lease = found
        return 0, p.encode_get_reply(
            self._lease_id(lease, owner), entry.alloc.nbytes, entry.alloc.extents, entry.checksum
        )

    def _get_many(self, data, max_reply: int, owner: int) -> tuple[int, bytes]:
        """Locations of several keys (same LOOKUP_PREFIX request layout), as many as fit the reply;
        the client asks again for the rest. An absent key answers lease 0 and no extents."""
        ns, keys = p.decode_lookup(data)
        index = self.index
        items: list[bytes] = []
        size = 4
        for key in keys:
            found = index.get(ns, key)
            if found is None:
                item = p.encode_get_many_item(0, 0, ())
            else:
                entry, lease = found
                item = p.encode_get_many_item(
                    self._lease_id(lease, owner), entry.alloc.nbytes, entry.alloc.extents, entry.checksum
                )
                if size + len(item) > max_reply:
                    index.release([lease])  # not answered: do not keep it leased
                    break
            if size + len(item) > max_reply:
                break
            items.append(item)
            size += len(item)
        if not items:
            return int(Code.TOO_BIG), b""
        return 0, struct.pack("<HH", len(items), 0) + b"".join(items)

    def _reserve(self, data, max_reply: int, owner: int) -> tuple[int, bytes]:
        if self.reserve_blocked:
            return int(Code.NOT_READY), b""
        ns, key, nbytes = p.decode_reserve(data)
        token, alloc = self.index.reserve(ns, key, nbytes, owner)
        if self.on_reserve is not None:
            self.on_reserve()
        if len(alloc.extents) > p.extents_capacity(max_reply):
            # The reply could not carry the extents: give the space back rather than leak it.
            self.index.abort(token)
            self.index.counters.aborts -= 1
            return int(Code.TOO_BIG), b""
        return 0, p.encode_reserve_reply(token, alloc.extents)

    def _commit(self, data, _max: int, owner: int) -> tuple[int, bytes]:
        token, checksum = p.decode_commit(data)
        if checksum is None:
            # A block nobody can verify would be served wrong, unnoticed, once a stalled writer
            # overwrote it: refused (counted as errors{NO_CHECKSUM}); the reservation stays the writer's.
            return int(Code.NO_CHECKSUM), b""
        self.index.commit(token, owner, checksum)
        return 0, b""

    def _count_item_error(self, code: Code) -> None:
        # What the single request would have counted: beluga_mds_errors_total{code} per refused item.
        self.error_count += 1
        self.errors[code.name] = self.errors.get(code.name, 0) + 1

    def _reserve_many(self, data, max_reply: int, owner: int) -> tuple[int, bytes]:
        """RESERVE of several keys of one namespace, in order, answered per key.

        Per key: a reservation, EXISTS (committed, or being written: the caller skips it) or
        POOL_FULL. The first POOL_FULL ends the request's reservations: every later key answers
        POOL_FULL untried (the caller's chain is useless past a hole, and reserving more would only
        evict for blocks nobody can reach). Keys whose reply does not fit are not answered (their
        space is given back) and the caller asks again for them; a key whose extents fit no reply
        at all answers TOO_BIG. A malformed request, an unknown namespace or a server still fencing
        refuses the whole request before anything is reserved.
        """
        if self.reserve_blocked:
            return int(Code.NOT_READY), b""
        ns, items = p.decode_reserve_many(data)
        index = self.index
        index._check_ns(ns)
        self.batched_items += len(items)
        out: list[bytes] = []
        size = 4
        full = False
        reserved = False
        refused_size = p.RESERVE_MANY_ITEM_SIZE
        for key, nbytes in items[:BATCH_ITEMS]:  # the rest: the caller asks again (a bounded step)
            if size + refused_size > max_reply:
                break  # not even a refusal fits: the caller asks again for the rest
            if full:
                out.append(p.encode_reserve_many_item(int(Code.POOL_FULL)))
                size += refused_size
                continue
            try:
                token, alloc = index.reserve(ns, key, nbytes, owner)
            except IndexError_ as exc:
                code = Code[exc.code]
                self._count_item_error(code)
                full = code == Code.POOL_FULL or code == Code.QUOTA  # a tenant's quota ends the chain too
                out.append(p.encode_reserve_many_item(int(code)))
                size += refused_size
                continue
            reserved = True
            item = p.encode_reserve_many_item(0, token, alloc.extents)
            if size + len(item) > max_reply:
                # The reply cannot carry these extents: give the space back rather than leak it.
                index.abort(token)
                index.counters.aborts -= 1
                if out:
                    break  # it may fit the next request, alone
                self._count_item_error(Code.TOO_BIG)
                out.append(p.encode_reserve_many_item(int(Code.TOO_BIG)))
                size += refused_size
                continue
            out.append(item)
            size += len(item)
        if reserved and self.on_reserve is not None:
            self.on_reserve()
        if not out:
            return int(Code.TOO_BIG), b""
        return 0, p.encode_many_reply(out)

    def _commit_many(self, data, _max: int, owner: int) -> tuple[int, bytes]:
        """COMMIT (or ABORT) of several tokens, in order, each exactly as its single request would
        do it (journal record, index, ownership check, counters), answered per token. A malformed
        request is refused whole before anything is committed."""
        items = p.decode_commit_many(data)
        index = self.index
        self.batched_items += len(items)
        codes: list[int] = []
        for token, checksum, action in items:
            if action == p.COMMIT_MANY_COMMIT and checksum is None:
                self._count_item_error(Code.NO_CHECKSUM)  # as COMMIT: every block carries its CRC32C
                codes.append(int(Code.NO_CHECKSUM))
                continue
            try:
                if action == p.COMMIT_MANY_ABORT:
                    index.abort(token, owner)
                else:
                    index.commit(token, owner, checksum)
            except IndexError_ as exc:
                code = Code[exc.code]
                self._count_item_error(code)
                codes.append(int(code))
            else:
                codes.append(0)
        return 0, p.encode_codes_reply(codes)

    def _removals(self, data, max_reply: int, _owner: int) -> tuple[int, bytes]:
        """Removed keys since the client's cursor (of one namespace, or all), as many as fit the
        reply and `max items`, looking at no more than SCAN_BUDGET records (mds/removal_log.py).

        A cursor past the log's head names removals that never happened in this epoch (a client
        that kept its cursor across a server restart would be answered STALE_EPOCH first): refused
        with BAD_ARGS. A namespace id never issued: UNKNOWN_NS (a dropped one is fine; its
        removals were recorded under that id, and ids are never reused)."""
        cursor, ns, max_items = p.decode_removals(data)
        log = self.index.removals
        if cursor > log.head:
            raise ProtocolError(Code.BAD_ARGS, f"REMOVALS: cursor {cursor} is past the log's head {log.head}")
        if ns > self.index.ns_id_bound:
            raise ProtocolError(Code.UNKNOWN_NS, f"REMOVALS: namespace id {ns} was never issued")
        index = self.index
        mine = index.tenant
        ns_tenant = index._ns_tenant
        # Another tenant's removals are none of this client's business (its keys name its prompts).
        foreign = index.tenants.named and ns != 0 and ns_tenant.get(ns, mine) is not mine
        if foreign:
            raise ProtocolError(Code.UNKNOWN_NS, f"REMOVALS: namespace id {ns} was never issued")
        lost = log.lost_before(cursor)
        start, stop = log.window(cursor)
        room = max_reply - p.REMOVALS_REPLY_HEAD
        if room < 0:
            return int(Code.TOO_BIG), b""
        full = room
        items: list[bytes] = []
        next_cursor = stop
        if max_items == 0:
            next_cursor = start  # a head query: only the head (and what is lost) is news
        else:
            for rec in log.records(start, stop, ns):
                if index.tenants.named and ns_tenant.get(rec.ns) is not mine:
                    continue  # another tenant's (or a dropped namespace's, whose tenant is forgotten)
                item = p.encode_removal_item(rec.ns, rec.why, rec.key)
                if len(item) > full:
                    lost += 1  # a key too long for any reply of this transport: skipped, not a stall
                    continue
                if len(items) >= max_items or len(item) > room:
                    next_cursor = rec.seq
                    break
                items.append(item)
                room -= len(item)
        return 0, p.encode_removals_reply(next_cursor, log.head, lost, items)

    def _abort(self, data, _max: int, owner: int) -> tuple[int, bytes]:
        self.index.abort(p.decode_u64(data, "ABORT"), owner)
        return 0, b""

    def _release(self, data, _max: int, owner: int) -> tuple[int, bytes]:
        """All or nothing: one id granted to another owner refuses the whole request (NOT_OWNER),
        unless the client says they were granted elsewhere and passed to it (RELEASE_GRANTED_ELSEWHERE)
        and every such id was granted to an owner of its own hand-over group (counted either way)."""
        ids, flags = p.decode_release_raw(data)
        granted_elsewhere = bool(flags & p.RELEASE_GRANTED_ELSEWHERE)
        seqs, foreign = self.leases.decode_many(ids, owner)
        if foreign and not (granted_elsewhere and self.groups.granted_within(self.leases, ids, owner, foreign)):
            # A stranger that learned a lease id (read from another ring's reply slot, or told)
            # would free a reader's block under it: the next writer would overwrite what it copies.
            self.index.counters.foreign_refused += 1
            return int(Code.NOT_OWNER), b""
        self.released_granted_elsewhere += foreign
        return 0, p.encode_u32(self.index.release(seqs))

    def _delete(self, data, _max: int, _owner: int) -> tuple[int, bytes]:
        ns, key = p.decode_key(data, "DELETE")
        return (0 if self.index.delete(ns, key) else int(Code.NOT_FOUND)), b""

    def _clear(self, data, _max: int, _owner: int) -> tuple[int, bytes]:
        return 0, p.encode_u64(self.index.clear_namespace(p.decode_u32(data, "CLEAR_NS")))

    def _stats(self, data, _max: int, _owner: int) -> tuple[int, bytes]:
        return 0, p.encode_stats(self.stats_counters())

    def _ping(self, data, _max: int, _owner: int) -> tuple[int, bytes]:
        return 0, bytes(data)

    @property
    def ops(self) -> dict[str, int]:
        return {o.name: self._op_counts[o] for o in Op}

    def stats_counters(self) -> dict[str, int]:
        s = self.index.stats()
        return {
            "epoch": self.epoch,
            "entries": s["entries"],
            "namespaces": s["namespaces"],
            "bytes_capacity": s["bytes_capacity"],
            "bytes_used": s["bytes_used"],
            "bytes_reserved": s["bytes_reserved"],
            "reservations": s["reservations"],
            "leases": s["leases"],
            "evictions": s["evictions"],
            "reservations_reclaimed": s["reservations_reclaimed"],
            "requests": self.requests,
            "errors": self.error_count,
        }
