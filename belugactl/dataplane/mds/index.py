"""The KV index: keys -> extents in the shared KV area, with two-phase puts, read leases and LRU eviction.

Not thread-safe by design: the metadata server runs it from one loop. Time comes from an injected
clock so tests can move it.

Lifecycle of a key:
    reserve -> (client writes the bytes) -> commit -> visible, in the LRU
    reserve -> abort / reservation timeout -> extents freed, never visible
    visible -> delete / clear-namespace / eviction -> invisible at once; extents freed when the
               last read lease on it ends (a reader holding a lease keeps reading valid bytes)
Eviction walks the LRU from the cold end, skipping leased entries; reservations are never in
the LRU, so an uncommitted block cannot be evicted. A commit that takes usage past the high
watermark only starts a sweep: the server evicts down to the low watermark in steps of EVICT_STEP
between its loop turns (`background_step`), answering requests in between, so no commit pays for
the whole sweep (at millions of blocks that was a pause of seconds). A reservation that cannot
allocate (the sweep fell behind, or a size class starves long before bytes run out) evicts at once
what it needs itself. A reservation first asks the allocator what evicting would achieve and evicts
only the coldest entries that make it fit, or, when that is fewer blocks, the blocks of whole chunks
that hold cold ones (a large block among small ones needs a free chunk); one that cannot fit even
then evicts nothing.

Namespaces are bounded (`max_namespaces`): at the cap, namespaces with no entry and no
reservation that have been idle for `namespace_idle_s` are dropped; if none can be, opening a new
one is refused with NS_LIMIT. Ids are never reused, so a client holding a dropped id gets
UNKNOWN_NS (or a miss), never another namespace's blocks.

No request costs more than its own keys: each namespace keeps its visible keys in a map of its own,
which every lookup, GET, RESERVE and DELETE reads; the reserved bytes are a running sum (STATS is
O(1)); and a clear swaps the namespace's map for an empty one (O(1), invisible to every lookup from
then on; the native fast path hands the namespace's requests to Python until the clear is done)
and removes the cleared entries (index, journal, removal log, blocks) in steps of CLEAR_STEP
between the server's loop turns (`clear_step`). A RESERVE of a cleared key not yet removed removes
it first. Per-owner caps (mds/quotas.py) bound the
leases, reserved bytes and namespaces one ring or connection holds; the listener names the owner
of the request it serves with `begin_request`.

Tenants (mds/quotas.py, set by `set_tenants` from the manifest): a namespace belongs to the tenant
whose client opened it, and the namespace table is keyed by (tenant, name), so another tenant's
client opening the same name gets a namespace of its own, and one naming another tenant's id gets
UNKNOWN_NS for every request (lookup, get, reserve, delete, clear). Each tenant keeps its own LRU;
eviction under pressure takes the coldest unleased block of the tenant furthest above its weighted
share of the area (`_victim_tenant`), so a tenant's commits evict only tenants above their share
(or its own blocks). With no tenants everything is the implicit tenant's: one LRU, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from belugactl.dataplane import native
from belugactl.dataplane.mds.allocator import BLOCK_SHIFT, CHUNK, CHUNK_SHIFT, Allocation, Allocator, FitPlanner
from belugactl.dataplane.mds.ownership import new_token
from belugactl.dataplane.mds.quotas import LeaseRoom, Quota, QuotaLimits, Quotas, Tenant, Tenants, TenantSpec
from belugactl.dataplane.mds.removal_log import WHY_CLEARED, WHY_DELETED, WHY_EVICTED, RemovalLog
from belugactl.dataplane.mds.sharded import IdMap, ShardedMap

Key = tuple[int, bytes]  # (namespace id, block hash)

# Cleared entries removed per step (server loop turn): a clear of a large namespace never holds the
# loop (and the CXL rings) for longer than this many removals (index, mirror, journal, blocks), which
# stays under the 5 ms pause budget (docs/measurements.md, 2026-12-07).
CLEAR_STEP = 128
# A namespace's native tenant cell while a clear of it is in progress: no ring's cell, so the fast
# path hands its requests to Python, which reads the namespace's own (already empty) map.
HELD = -2
# Leased entries an eviction step walks past at most in one tenant's LRU before it tries the next
# tenant (leases move entries to the hot end, so the cold end is rarely leased): no step grows
# with the index.
EVICT_SCAN = 1024
# Blocks one step of the watermark sweep evicts: about 10 us each (a journal record, the mirror, the
# removals log), so a step stays near a millisecond; the server takes one every few dozen requests,
# far more steps than the commits that fill the pool need.
EVICT_STEP = 128
# A tenant's composite namespace key: "<tenant>\0<name>" (clients cannot send a NUL in a name).
_TENANT_SEP = "\x00"
_fi_set_room = native.optional("fi_set_room")
_make_entries = native.optional("make_entries")


class IndexError_(Exception):
    """A refused index operation; `code` is the protocol result code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Entry:
    key: Key
    alloc: Allocation
    leases: int = 0
    dead: bool = False  # deleted/evicted while leased: free when leases reach zero
    id: int = 0  # names the entry in the native lookup mirror's lease log
    checksum: int | None = None  # CRC32C of the block as its writer committed it (None: not given)
    slot: int = -1  # its place in KVIndex.slab while it is visible
    gen: Any = None  # its tenant's LRU generation while it is in the LRU (mds/sharded.py)


@dataclass(slots=True)
class Pending:
    key: Key
    alloc: Allocation
    deadline: float
    owner: int = 0  # the ring or connection that reserved it (mds/ownership.py)
    tenant: Tenant | None = None  # whose reserved bytes it counts in


class _LeaseBurst:
    __slots__ = ("first", "last", "deadline", "log", "per_entry", "live", "table", "rings")

    def __init__(
        self, first: int, last: int, deadline: float, log: bytes, per_entry: bytes, live: int, rings: dict[int, int]
    ) -> None:
        self.first, self.last, self.deadline = first, last, deadline
        self.log, self.per_entry, self.live = log, per_entry, live
        self.rings = rings  # ring -> its leases of this burst still live
        # lease id -> (ring, entry ids), built on first release
        self.table: dict[int, tuple[int, list[int]]] | None = None

    def detail(self) -> dict[int, tuple[int, list[int]]]:
        if self.table is None:
            words = memoryview(self.log).cast("q").tolist()
            table: dict[int, tuple[int, list[int]]] = {}
            i = 0
            while i < len(words):
                w = words[i + 1]
                n = w & 0xFFFF  # the count word carries the ring above bit 16 (_native_fastpath.c)
                table[words[i]] = (w >> 16, words[i + 2 : i + 2 + n])
                i += 2 + n
            self.table = table
        return self.table


@dataclass
class IndexConfig:
    lease_ttl_s: float = 10.0
    reservation_ttl_s: float = 30.0
    high_watermark: float = 0.90
    low_watermark: float = 0.80
    zero_on_free: bool = False
    max_namespaces: int = 4096
    # Live read leases one client (a ring or a connection) may hold at once (quotas.DEFAULT_LIVE_LEASES)
    client_live_leases: int = 32768
    # Software interleave (manifest pool.interleave.mode: software): the index sets it on its
    # allocator, so every server that builds an index from this config places extents the same way.
    interleave_ways: int = 1
    interleave_granularity: int = 2 << 20
    namespace_idle_s: float = 60.0  # an empty namespace unused this long may be dropped at the cap
    # Removed keys kept for REMOVALS (mds/removal_log.py): at most ~300 B each (a 255-byte key).
    removal_log_size: int = 16384


@dataclass
class Counters:
    evictions: int = 0
    evicted_bytes: int = 0
    evictions_refused: int = 0  # reservations that no eviction could have made fit (nothing evicted)
    namespaces_dropped: int = 0
    namespaces_refused: int = 0
    reservations_reclaimed: int = 0
    leases_expired: int = 0
    commits: int = 0
    aborts: int = 0
    pool_full: int = 0
    hits: int = 0
    misses: int = 0
    foreign_refused: int = 0  # COMMIT/ABORT/RELEASE of another owner's token or lease
    saved_bytes: int = 0  # bytes of blocks committed (what writers saved into the pool)
    commits_checksummed: int = 0  # commits that carried the block's CRC32C (readers can verify)
    leased_bytes: int = 0  # bytes of blocks leased to readers (what they load from the pool)


class KVIndex:
    def __init__(
        self,
        allocator: Allocator,
        config: IndexConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        zero: Callable[[int, int], None] | None = None,
    ) -> None:
        self.alloc = allocator
        self.config = config or IndexConfig()
        if self.config.interleave_ways > 1:
            allocator.set_interleave(self.config.interleave_ways, self.config.interleave_granularity)
        self.clock = clock
        self._zero = zero
        self.namespaces: dict[str, int] = {}
        self.ns_names: dict[int, str] = {}
        self.ns_id_bound = 0  # highest namespace id ever issued (ids are not reused)
        self._ns_live: dict[int, int] = {}  # namespace id -> entries + reservations
        self._ns_empty: dict[int, float] = {}  # empty namespaces -> when last used, oldest first
        self.entries: ShardedMap = ShardedMap()  # Key -> Entry (mds/sharded.py: no doubling pause)
        self.pending: dict[int, Pending] = {}
        self.pending_keys: dict[Key, int] = {}
        # lease id -> the entries it holds; deadlines live in _lease_q (one TTL, so in order).
        self.leases: dict[int, list[Entry]] = {}
        # Deadlines only grow (one TTL each), so expiry pops from the left of these queues
        # instead of scanning every live lease.
        self._lease_q: deque[tuple[float, int]] = deque()
        self._pending_q: deque[tuple[float, int]] = deque()
        self.next_lease = 1  # shared with the native fast path, which grants leases too
        # Leases granted by the native fast path, one record per burst, in id (and deadline) order.
        self._bursts: list[_LeaseBurst] = []
        self._burst_first: list[int] = []
        self._burst_head = 0
        self.burst_leases = 0
        self._entry_ids = itertools.count(1)
        self.by_id = IdMap()  # entry id -> Entry (mds/sharded.py: a restore's ids in one list)
        # The native lookup mirror (fi_put/fi_del) follows every change of what is visible.
        self.mirror: Any = None
        self._mirror_put_entries: Any = None  # attach_mirror's many-at-once put, if it has one
        self.mirror_misses = 0  # keys too long to mirror (lookups of them take the Python path)
        # Optional journal (restart policy "journal"): told of every commit and removal.
        self.journal: Any = None
        self.counters = Counters()
        # What was removed, for clients that follow evictions (vLLM schedulers publishing BlockRemoved).
        self.removals = RemovalLog(self.config.removal_log_size)
        # Per-owner caps; `owner` is the ring or connection whose request is being served.
        self.quotas = Quotas(
            QuotaLimits.defaults(allocator.capacity, self.config.max_namespaces, self.config.client_live_leases)
        )
        self.owner = 0
        # live lease id -> (its owner's quota, its tenant) (Python-granted leases)
        self._lease_owner: dict[int, tuple[Quota, Tenant]] = {}
        self._ns_owner: dict[int, int] = {}  # namespace id -> the owner that created it
        # Tenants: the implicit one alone until set_tenants; its LRU is self.lru.
        self.tenants = Tenants()
        self.tenant: Tenant = self.tenants.default  # the tenant of the request being served
        self.lru = self.tenants.default.lru
        self._ns_tenant: dict[int, Tenant] = {}  # namespace id -> its tenant
        self.room: LeaseRoom | None = None  # what the native fast path may still grant (set_rings)
        self._rings = 0
        # With tenants: namespace id -> its tenant's room cell, for the native fast path's check that
        # a ring names only its own tenant's namespaces (-1: none); grown by doubling, then re-attached.
        self._ns_slot: array | None = None
        # Within one request (begin_request .. end_request): key -> the lease it got, so a
        # GET_MANY naming one key many times holds one lease for it, not one per repeat.
        self._memo: dict[Key, int] | None = None
        self._memo_reused: dict[int, int] = {}
        self._ns_keys: dict[int, ShardedMap] = {}  # namespace id -> its committed entries (key -> Entry)
        # Clears in progress: (namespace id, what is left of its cleared map). A cleared entry stays in
        # `entries` (and the slab, its LRU, the mirror) until a step removes it; it is not in its
        # namespace's map, which is what makes it invisible.
        self._clearing: deque[tuple[int, list[dict]]] = deque()
        self._cleared_live = 0  # cleared entries still in `entries`
        self.reserved_footprint = 0  # bytes of blocks held by reservations (STATS' bytes_reserved)
        self.sweeping = False  # usage passed the high watermark: evict in steps down to the low one
        # Small-block offset >> BLOCK_SHIFT (mds/allocator.py: why not the offset) -> the committed entry
        # holding it (an entry has at most one block smaller than a chunk): which entries share a
        # chunk, for eviction that empties whole chunks.
        self._at: ShardedMap = ShardedMap()
        # Every visible entry at a place that never moves (freed places are reused): a walk over it in
        # steps sees each entry once, whatever changes between the steps (the journal's rewrite).
        self.slab: list[Entry | None] = []
        self._free_slots: list[int] = []

    # --- the request being served -------------------------------------------------------------
    def begin_request(self, owner: int) -> None:
        self.owner = owner
        self.tenant = self.tenants.of(owner)
        self._memo = {}

    # --- tenants ------------------------------------------------------------------------------
    def set_tenants(self, specs: tuple[TenantSpec, ...] | list[TenantSpec], ring_tenant: dict[int, str]) -> None:
        """The manifest's tenants, and which ring is whose (ring -> tenant name). Before any entry."""
        if self.entries or self.pending or self.namespaces:
            raise RuntimeError("set_tenants: the index already holds namespaces")
        self.tenants = Tenants(specs)
        self.tenant = self.tenants.default
        self.lru = self.tenants.default.lru
        for ring, name in ring_tenant.items():
            self.tenants.assign(ring, self.tenants.by_name[name])
        self.set_rings(self._rings)

    def set_rings(self, rings: int) -> None:
        """How many CXL rings there are (owners 0..rings-1): the native fast path's lease room."""
        self._rings = rings
        t = self.tenants
        self.room = LeaseRoom(rings, t, {r: t.of(r) for r in range(rings)}, self.quotas.limits.live_leases)
        self._attach_room()

    def _make_ns_cells(self) -> None:
        """Each namespace's tenant cell (-1: no namespace), for the native fast path's check."""
        cells = array("q", [-1]) * max(1024, 2 * (self.ns_id_bound + 1))
        for ns, tenant in self._ns_tenant.items():
            cells[ns] = tenant.slot
        self._ns_slot = cells

    def _attach_room(self) -> None:
        if self.tenants.named and self._ns_slot is None:
            self._make_ns_cells()
        if self.mirror is not None and self.room is not None and _fi_set_room is not None:
            _fi_set_room(self.mirror, self.room.room, self.room.ring_slot.tobytes(), self._ns_slot)

    def _set_ns_slot(self, ns: int, slot: int) -> None:
        cells = self._ns_slot
        if cells is None:
            return
        if ns >= len(cells):
            grown = array("q", [-1]) * (2 * max(ns, len(cells)))
            grown[: len(cells)] = cells
            self._ns_slot = grown
            self._attach_room()  # the fast path lets go of the old array and takes this one
            cells = grown
        cells[ns] = slot

    def _tenant_of_name(self, key: str) -> Tenant:
        tname, sep, _ = key.partition(_TENANT_SEP)
        return self.tenants.by_name.get(tname, self.tenants.default) if sep else self.tenants.default

    def end_request(self) -> None:
        self._memo = None
        if self._memo_reused:
            self._memo_reused.clear()

    # --- namespaces ---------------------------------------------------------------------------
    def open_namespace(self, name: str) -> int:
        tenant = self.tenant
        if _TENANT_SEP in name:
            raise IndexError_("BAD_ARGS", "a namespace name has no NUL character")
        if tenant is not self.tenants.default:
            name = tenant.name + _TENANT_SEP + name  # (tenant, name): another tenant's is another namespace
        ns = self.namespaces.get(name)
        if ns is None:
            quota = self.quotas.of(self.owner)
            full = len(self.namespaces) >= self.config.max_namespaces
            if full or quota.namespaces >= quota.limits.namespaces or tenant.namespaces >= tenant.max_namespaces:
                self._drop_idle_namespaces()
            if tenant.namespaces >= tenant.max_namespaces:
                self.counters.namespaces_refused += 1
                tenant.refused["namespaces"] += 1
                raise IndexError_("QUOTA", f"tenant {tenant.name!r} holds {tenant.namespaces} namespaces (its quota)")
            if len(self.namespaces) >= self.config.max_namespaces:
                self.counters.namespaces_refused += 1
                raise IndexError_(
                    "NS_LIMIT",
                    f"{len(self.namespaces)} namespaces are open (max_namespaces) and none is idle and empty",
                )
            if quota.namespaces >= quota.limits.namespaces:
                self.counters.namespaces_refused += 1
                self.quotas.refused.namespaces += 1
                raise IndexError_(
                    "NS_LIMIT", f"this client created {quota.namespaces} namespaces (its quota); it may open no more"
                )
            ns = self._new_namespace(name)
            quota.namespaces += 1
            self._ns_owner[ns] = self.owner
            return ns
        if self._ns_tenant[ns] is not tenant:  # cannot happen: the key names the tenant
            raise IndexError_("UNKNOWN_NS", "another tenant's namespace")
        if ns in self._ns_empty:  # opened again: idle from now
            del self._ns_empty[ns]
            self._ns_empty[ns] = self.clock()
        return ns

    def _new_namespace(self, name: str) -> int:
        self.ns_id_bound += 1
        ns = self.ns_id_bound
        self.namespaces[name] = ns
        self.ns_names[ns] = name
        self._ns_live[ns] = 0
        self._ns_empty[ns] = self.clock()
        self._ns_keys[ns] = ShardedMap()
        tenant = self._tenant_of_name(name)
        self._ns_tenant[ns] = tenant
        tenant.namespaces += 1
        self._set_ns_slot(ns, tenant.slot)
        return ns

    def _drop_idle_namespaces(self) -> None:
        cutoff = self.clock() - self.config.namespace_idle_s
        doomed = []
        for ns, since in self._ns_empty.items():  # oldest first: stop at the first recent one
            if since > cutoff:
                break
            doomed.append(ns)
        for ns in doomed:
            del self._ns_empty[ns], self._ns_live[ns], self.namespaces[self.ns_names.pop(ns)]
            self._ns_keys.pop(ns, None)
            self._ns_tenant.pop(ns).namespaces -= 1
            self._set_ns_slot(ns, -1)
            creator = self._ns_owner.pop(ns, None)
            if creator is not None:
                self.quotas.of(creator).namespaces -= 1
        self.counters.namespaces_dropped += len(doomed)

    def _ns_add(self, ns: int, count: int = 1) -> None:
        n = self._ns_live[ns]
        if not n:
            self._ns_empty.pop(ns, None)
        self._ns_live[ns] = n + count

    def _ns_sub(self, ns: int) -> None:
        n = self._ns_live[ns] - 1
        self._ns_live[ns] = n
        if not n:
            self._ns_empty[ns] = self.clock()

    def _check_ns(self, ns: int) -> Tenant:
        """The namespace's tenant; UNKNOWN_NS for an id never issued, dropped, or another tenant's."""
        t = self._ns_tenant.get(ns)
        if t is None or (t is not self.tenant and self.tenants.named):
            raise IndexError_("UNKNOWN_NS", f"namespace id {ns} was never opened (by this tenant)")
        return t

    # --- reads --------------------------------------------------------------------------------
    def lookup_prefix(self, ns: int, keys: Sequence[bytes]) -> tuple[int, int]:
        """Leading present count, and a lease id covering those blocks (0 if none)."""
        tenant = self._check_ns(ns)
        found: list[Entry] = []
        visible = self._ns_keys[ns]
        for k in keys:
            e = visible.get(k)
            if e is None:
                break
            found.append(e)
        lease = self._grant(found, tenant) if found else 0
        if not lease:
            self.counters.misses += 1
            return 0, 0
        self.counters.hits += 1
        return len(found), lease

    def get(self, ns: int, key: bytes) -> tuple[Entry, int] | None:
        tenant = self._check_ns(ns)
        k = (ns, key)
        e = self._ns_keys[ns].get(key)
        memo = self._memo
        if memo is not None and e is not None:
            lease = memo.get(k, 0)
            if lease in self.leases:  # named again in this request: the lease it already got
                self._memo_reused[lease] = self._memo_reused.get(lease, 0) + 1
                self.counters.hits += 1
                return e, lease
        lease = self._grant([e], tenant) if e is not None else 0
        if not lease:
            self.counters.misses += 1
            return None
        if memo is not None:
            memo[k] = lease
        self.counters.hits += 1
        return e, lease

    def _grant(self, found: list[Entry], tenant: Tenant) -> int:
        """A lease on `found` (entries of one namespace of `tenant`) for the current owner; 0 (a miss)
        when the owner, or the owner's tenant, holds its quota of leases."""
        owner = self.owner
        quota = self.quotas.of(owner)
        mine = self.tenant
        if quota.live_leases >= quota.limits.live_leases:
            self.quotas.refused.leases += 1
            return 0
        if mine.live_leases >= mine.max_leases:
            mine.refused["leases"] += 1
            return 0
        quota.live_leases += 1
        mine.live_leases += 1
        room = self.room
        if room is not None:  # what the native fast path may still grant (LeaseRoom.owner/.tenant, inlined)
            cells = room.room
            if owner < room.rings:
                cells[owner] = quota.limits.live_leases - quota.live_leases
            cells[mine.slot] = mine.max_leases - mine.live_leases
        lru = tenant.lru
        leased = 0
        for e in found:
            e.leases += 1
            leased += e.alloc.nbytes
            lru.touch(e)
        self.counters.leased_bytes += leased
        lease = self.next_lease
        self.next_lease = lease + 1
        deadline = self.clock() + self.config.lease_ttl_s
        self.leases[lease] = found
        self._lease_owner[lease] = (quota, mine)
        self._lease_q.append((deadline, lease))
        return lease

    def _lease_ended(self, lease: int) -> None:
        holder = self._lease_owner.pop(lease, None)
        if holder is not None:
            quota, tenant = holder
            quota.live_leases -= 1
            tenant.live_leases -= 1
            room = self.room
            if room is not None:  # LeaseRoom.owner/.tenant, inlined (a release of a long prompt ends many)
                cells = room.room
                if 0 <= quota.owner < room.rings:
                    cells[quota.owner] = quota.limits.live_leases - quota.live_leases
                cells[tenant.slot] = tenant.max_leases - tenant.live_leases

    def _burst_leases_ended(self, ring: int, n: int) -> None:
        """`n` leases the native fast path granted to `ring` ended (released or expired)."""
        quota = self.quotas.of(ring)
        tenant = self.tenants.of(ring)
        quota.live_leases -= n
        tenant.live_leases -= n
        room = self.room
        if room is not None:
            room.owner(quota)
            room.tenant(tenant)

    def restore(self, items: list[tuple[str, bytes, Allocation]], checksums: list[int | None] | None = None) -> None:
        """Insert committed entries (namespace name, key, allocation) rebuilt from a journal; see
        `restore_columns`."""
        at = {name: i for i, name in enumerate(dict.fromkeys(name for name, _k, _a in items))}
        names = list(at)
        self.restore_columns(
            names, [at[n] for n, _k, _a in items], [k for _n, k, _a in items], [a for _n, _k, a in items], checksums
        )

    def restore_columns(
        self,
        names: Sequence[str],
        ns_of: Sequence[int],
        keys: Sequence[bytes],
        allocs: Sequence[Allocation],
        checksums: Sequence[int | None] | None = None,
    ) -> None:
        """Insert committed entries rebuilt from a journal (allocator already restored): entry i is
        key `keys[i]` of namespace `names[ns_of[i]]`, at `allocs[i]`. A key given twice keeps its first.
        A restart runs it over millions of entries, so it works a column at a time: each map and LRU
        takes its entries in one call (mds/sharded.py), not a method call per entry."""
        n = len(keys)
        if not len(ns_of) == len(allocs) == n or (checksums and len(checksums) != n):
            raise ValueError(f"restore: columns of unequal length for {n} entries")
        ns_ids = [0] * len(names)
        used_ns = set(ns_of)
        for i in used_ns:
            name = names[i]
            ns_ids[i] = self.namespaces.get(name) or self._new_namespace(name)  # no cap: these hold blocks
        first = next(self._entry_ids)
        self._entry_ids = itertools.count(first + n)  # ids first..first+n-1, one per entry made here
        sums = checksums if checksums else itertools.repeat(None, n)
        slab = self.slab
        # Each entry made at its place in the slab, the slab's next ones (unless freed places are
        # reused, or a key given twice leaves a gap: then they are placed again below).
        ns_col = None
        if _make_entries is not None and type(keys) is type(allocs) is list and type(checksums) in (list, type(None)):
            # u32 namespace numbers, as the native replay gives them; others: the comprehension below
            with contextlib.suppress(OverflowError, TypeError):
                ns_col = ns_of if isinstance(ns_of, memoryview) and ns_of.format == "I" else array("I", ns_of)
        if ns_col is not None:
            # The same entries, made in C (_native_restore.c): 400 ns an entry here, at millions.
            made = _make_entries(Entry, ns_ids, ns_col, keys, allocs, checksums or None, first, len(slab))
        else:
            made = [
                Entry((ns_ids[j], key), a, 0, False, i, crc, slot)
                for i, j, key, a, crc, slot in zip(
                    range(first, first + n), ns_of, keys, allocs, sums, range(len(slab), len(slab) + n), strict=False
                )
            ]
        kept = self.entries.put_new([e.key for e in made], made)
        del made
        whole = len(kept) == n  # no key twice: kept[i] is entry i, at allocs[i], with key keys[i]
        if self._free_slots:
            for e in kept:
                self._slab_add(e)
        else:
            if not whole:
                for slot, e in enumerate(kept, len(slab)):
                    e.slot = slot
            slab.extend(kept)
        # Small blocks (by block number), each namespace's keys and each tenant's LRU (in journal order).
        at_offs: list[int] = []
        at_entries: list[Entry] = []
        # With no key given twice kept[i] is at allocs[i], so only the allocations that are not one
        # whole chunk need a look (a restart of 2 MiB blocks: none).
        for i in Allocation.not_one_chunk(allocs) if whole else range(len(kept)):
            e = kept[i]
            one = e.alloc.single
            if one is None:
                self._place(e)
            elif one[0] < CHUNK:
                at_offs.append(one[1] >> BLOCK_SHIFT)
                at_entries.append(e)
        per_ns: dict[int, list[Entry]] = {}
        if len(used_ns) <= 1:  # one namespace (a restart of one model's cache): the entries as they are
            if kept:
                per_ns[kept[0].key[0]] = kept
        else:
            last_ns, group = -1, None
            for e in kept:
                ns = e.key[0]
                if ns != last_ns:
                    group = per_ns.get(ns)
                    if group is None:
                        group = per_ns[ns] = []
                    last_ns = ns
                group.append(e)  # type: ignore[union-attr]
        self._at.put_many(at_offs, at_entries)
        del at_offs, at_entries
        if whole:  # ids first..first+n-1, in order
            self.by_id.put_run(first, kept)
        else:  # a key was given twice: the ids kept have gaps
            self.by_id.put_many([e.id for e in kept], kept)
        tenant_of = self._ns_tenant
        if len({id(tenant_of[ns]) for ns in per_ns}) <= 1:  # one tenant (the usual case): one LRU
            if kept:
                tenant_of[kept[0].key[0]].lru.add_many(kept)
        else:
            for e in kept:
                tenant_of[e.key[0]].lru.add(e)
        for ns, group in per_ns.items():
            one_column = group is kept and whole  # the key and allocation columns are this group's
            self._ns_keys[ns].put_many(keys if one_column else [e.key[1] for e in group], group)
            held = allocs if one_column else [e.alloc for e in group]
            tenant_of[ns].stored_bytes += sum(a.nbytes for a in held)
            self._ns_add(ns, len(group))
        self._mirror_all(kept)

    def _mirror_all(self, es: Iterable[Entry]) -> None:
        """Put each entry in the native mirror, if there is one (a restore, or a mirror attached late)."""
        mirror = self.mirror
        if mirror is None:
            return
        if self._mirror_put_entries is not None:
            es = es if isinstance(es, list) else list(es)
            self.mirror_misses += len(es) - self._mirror_put_entries(mirror, es, self._mirror_reply)
            return
        put, reply = self._mirror_put, self._mirror_reply
        for e in es:
            k = e.key
            if not put(mirror, k[0], k[1], e.id, reply(e)):
                self.mirror_misses += 1

    def attach_mirror(
        self,
        mirror: Any,
        put: Callable[..., bool],
        delete: Callable[..., bool],
        get_reply: Callable[[Entry], bytes] | None = None,
        *,
        put_entries: Callable[[Any, list[Entry], Callable[[Entry], bytes]], int] | None = None,
    ) -> None:
        """Keep a native mirror of the visible keys in step (see native fast_serve).

        `get_reply(entry)` gives the bytes the mirror answers a GET of that entry with;
        `put_entries(mirror, entries, get_reply) -> keys put`, when given, puts many entries in one
        call (what a restore does, for millions), leaving the mirror as `put` of each would.
        """
        self.mirror, self._mirror_put, self._mirror_del = mirror, put, delete
        self._mirror_reply = get_reply or (lambda e: b"")
        self._mirror_put_entries = put_entries
        self._attach_room()
        self._mirror_all(self.entries.values())

    def apply_lease_burst(self, first: int, last: int, count: int, log: bytes, per_entry: bytes) -> None:
        """Record the leases the native fast path granted in one burst (ids first..last, `count` of them).

        `per_entry` holds (entry id, leases) int64 pairs, so each entry is touched once per burst
        however many lookups hit it; the per-lease detail (`log`: (lease id, n, n entry ids)
        records) is only parsed if one of these leases is released before it expires.
        """
        if not count:
            return
        words = memoryview(per_entry).cast("q").tolist()
        by_id = self.by_id
        ns_tenant = self._ns_tenant
        leased = 0
        rings: dict[int, int] = {}
        quotas, tenants, room = self.quotas, self.tenants, self.room
        for i in range(0, len(words), 2):
            x = words[i]
            if x < 0:  # (-1 - ring, leases): what each ring got in this burst, counted in its quotas
                ring, n = -1 - x, words[i + 1]
                rings[ring] = n
                quota, tenant = quotas.of(ring), tenants.of(ring)
                quota.live_leases += n
                tenant.live_leases += n
                if room is not None:
                    room.owner(quota)
                    room.tenant(tenant)
                continue
            e = by_id[x]
            e.leases += words[i + 1]
            leased += words[i + 1] * e.alloc.nbytes
            ns_tenant[e.key[0]].lru.touch(e)
        self.counters.leased_bytes += leased
        self._bursts.append(
            _LeaseBurst(first, last, self.clock() + self.config.lease_ttl_s, log, per_entry, count, rings)
        )
        self._burst_first.append(first)
        self.burst_leases += count

    def _find_burst(self, lid: int) -> _LeaseBurst | None:
        i = bisect_right(self._burst_first, lid, self._burst_head) - 1
        if i >= self._burst_head:
            burst = self._bursts[i]
            if burst.first <= lid <= burst.last:
                return burst
        return None

    def lease_entries(self, lid: int) -> list[Entry]:
        """The entries a live lease holds (empty if it ended)."""
        if lid in self.leases:
            return list(self.leases[lid])
        burst = self._find_burst(lid)
        if burst is None:
            return []
        return [self.by_id[x] for x in burst.detail().get(lid, (0, ()))[1]]

    def release(self, lease_ids: Sequence[int]) -> int:
        released = 0
        reused = self._memo_reused
        for lid in lease_ids:
            if reused and reused.get(lid):
                reused[lid] -= 1  # another answer of this request still holds it
                continue
            lease = self.leases.pop(lid, None)
            if lease is not None:
                self._lease_ended(lid)
                self._drop_lease(lease)
                released += 1
                continue
            burst = self._find_burst(lid)
            if burst is not None:
                held = burst.detail().pop(lid, None)
                if held is not None:
                    ring, ids = held
                    for x in ids:
                        self._unlease(self.by_id[x], 1)
                    burst.live -= 1
                    self.burst_leases -= 1
                    if ring in burst.rings:
                        burst.rings[ring] -= 1
                        self._burst_leases_ended(ring, 1)
                    released += 1
        return released

    def _drop_lease(self, lease: list[Entry]) -> None:
        for e in lease:
            self._unlease(e, 1)

    def _unlease(self, e: Entry, n: int) -> None:
        e.leases -= n
        if e.dead and e.leases == 0:
            self.by_id.pop(e.id, None)
            self._free(e.alloc)

    # --- writes -------------------------------------------------------------------------------
    def reserve(self, ns: int, key: bytes, nbytes: int, owner: int = 0) -> tuple[int, Allocation]:
        tenant = self._check_ns(ns)
        k = (ns, key)
        if key in self._ns_keys[ns]:
            raise IndexError_("EXISTS", "the key is committed already")
        if self._cleared_live:
            old = self.entries.get(k)
            if old is not None:  # cleared, not yet removed: remove it first (journal order)
                self._remove(old, WHY_CLEARED)
        token = self.pending_keys.get(k)
        if token is not None:
            if self.pending[token].deadline > self.clock():
                raise IndexError_("EXISTS", "another client is writing this key")
            self._reclaim(token)
        if not self.alloc.can_ever_fit(nbytes):
            self.counters.pool_full += 1
            raise IndexError_("POOL_FULL", f"{nbytes} bytes exceed the whole shared KV area")
        quota = self.quotas.of(owner)
        if quota.reserved_bytes and quota.reserved_bytes + nbytes > quota.limits.reserved_bytes:
            # Before any eviction: a client over its share evicts nobody's blocks. (One
            # reservation is always allowed, however large: a block bigger than the share.)
            self.counters.pool_full += 1
            self.quotas.refused.reserved_bytes += 1
            raise IndexError_("POOL_FULL", f"this client holds {quota.reserved_bytes} reserved bytes (its quota)")
        if tenant.reserved_bytes and tenant.reserved_bytes + nbytes > tenant.max_reserved:
            self.counters.pool_full += 1
            tenant.refused["reserved_bytes"] += 1
            raise IndexError_(
                "QUOTA", f"tenant {tenant.name!r} holds {tenant.reserved_bytes} reserved bytes (its quota)"
            )
        if tenant.stored_bytes + tenant.reserved_bytes + nbytes > tenant.max_stored:
            # Over its stored quota: its own coldest blocks go first (nobody else's), a batch at most.
            self._evict_own(tenant, tenant.stored_bytes + tenant.reserved_bytes + nbytes - tenant.max_stored)
            if tenant.stored_bytes + tenant.reserved_bytes + nbytes > tenant.max_stored:
                self.counters.pool_full += 1
                tenant.refused["stored_bytes"] += 1
                raise IndexError_("QUOTA", f"tenant {tenant.name!r} stores {tenant.stored_bytes} bytes (its quota)")
        a = self.alloc.alloc(nbytes) or self._evict_for(nbytes, tenant)
        if a is None:
            self.counters.pool_full += 1
            raise IndexError_("POOL_FULL", "no space, and evicting unleased blocks would not make room")
        token = new_token(self.pending)
        deadline = self.clock() + self.config.reservation_ttl_s
        self.pending[token] = Pending(k, a, deadline, owner, tenant)
        self._pending_q.append((deadline, token))
        self.pending_keys[k] = token
        quota.reserved_bytes += nbytes
        tenant.reserved_bytes += nbytes
        self.reserved_footprint += a.footprint
        self._ns_add(ns)
        return token, a

    def _unreserve(self, p: Pending) -> None:
        self.quotas.of(p.owner).reserved_bytes -= p.alloc.nbytes
        if p.tenant is not None:
            p.tenant.reserved_bytes -= p.alloc.nbytes
        self.reserved_footprint -= p.alloc.footprint

    def _take_pending(self, token: int, owner: int | None) -> Pending:
        """The reservation `token` names, if `owner` (None: the server itself) may finish it."""
        p = self.pending.get(token)
        if p is None:
            raise IndexError_("NO_RESERVATION", f"reservation {token} is unknown or was reclaimed")
        if owner is not None and p.owner != owner:
            self.counters.foreign_refused += 1
            raise IndexError_("NOT_OWNER", f"reservation {token} belongs to another ring or connection")
        del self.pending[token]
        del self.pending_keys[p.key]
        self._unreserve(p)
        # Finished reservations leave the deadline queue from its head now, not when their deadline
        # passes: at 40 k saves/s a TTL's worth of them was 1.2 M tuples (150 MB) waiting for expire.
        pq, pending = self._pending_q, self.pending
        while pq and pq[0][1] not in pending:
            pq.popleft()
        return p

    def commit(self, token: int, owner: int | None = None, checksum: int | None = None) -> None:
        p = self._take_pending(token, owner)
        e = Entry(p.key, p.alloc, id=next(self._entry_ids), checksum=checksum)
        if self.journal is not None:
            self.journal.committed(e)  # on media before anyone hears "committed"
        self.entries[p.key] = e
        self._place(e)
        self._slab_add(e)
        tenant = p.tenant or self.tenants.default
        tenant.lru.add(e)
        tenant.stored_bytes += p.alloc.nbytes
        self._ns_keys[p.key[0]][p.key[1]] = e
        self.by_id[e.id] = e
        if self.mirror is not None and not self._mirror_put(
            self.mirror, p.key[0], p.key[1], e.id, self._mirror_reply(e)
        ):
            self.mirror_misses += 1
        self.counters.commits += 1
        if checksum is not None:
            self.counters.commits_checksummed += 1
        self.counters.saved_bytes += p.alloc.nbytes
        if not self.sweeping and self.alloc.used > self.config.high_watermark * self.alloc.capacity:
            self.sweeping = True  # the server's loop evicts, a step at a time (background_step)

    def abort(self, token: int, owner: int | None = None) -> None:
        p = self._take_pending(token, owner)
        self.counters.aborts += 1
        self._ns_sub(p.key[0])
        self._free(p.alloc)

    def delete(self, ns: int, key: bytes) -> bool:
        self._check_ns(ns)
        e = self._ns_keys[ns].get(key)
        if e is None:
            return False
        self._remove(e, WHY_DELETED)
        return True

    def clear_namespace(self, ns: int) -> int:
        """Make every entry of `ns` invisible at once (its map swapped for an empty one: O(1)); their
        removal (index, journal, removal log, freeing) follows in `clear_step`s, meanwhile the native
        fast path leaves the namespace to Python. Returns how many were cleared."""
        self._check_ns(ns)
        keys = self._ns_keys[ns]
        if not keys:
            return 0
        n = len(keys)
        self._ns_keys[ns] = ShardedMap()
        self._cleared_live += n
        rest = keys.parts()  # emptied as the steps go: the entries are freed a step at a time too
        if n <= CLEAR_STEP:
            self._clear_some(ns, rest, n)  # small: done in this request
            return n
        self._clearing.append((ns, rest))
        self._hold(ns)
        return n

    def _clear_some(self, ns: int, rest: list[dict], budget: int) -> tuple[int, bool]:
        """Remove up to `budget` entries of a cleared map, given as its dicts (those removed since, by a
        RESERVE of the key, an eviction or a poisoned block, are passed over); (how many were looked
        at, whether the map is empty now)."""
        entries = self.entries
        n = 0
        while rest:
            part = rest[-1]
            if not part:
                rest.pop()
            elif n < budget:
                key, e = part.popitem()
                n += 1
                if entries.get((ns, key)) is e:
                    self._remove(e, WHY_CLEARED)
            else:
                break
        return n, not rest

    @property
    def clearing(self) -> int:
        """Cleared entries whose removal is still pending."""
        return self._cleared_live

    def clear_step(self, budget: int = CLEAR_STEP) -> int:
        """Go on with the clears in progress, looking at most at `budget` cleared entries; how many."""
        n = 0
        clearing = self._clearing
        while clearing and n < budget:
            ns, rest = clearing[0]
            done, ended = self._clear_some(ns, rest, budget - n)
            n += done
            if ended:
                clearing.popleft()
                self._unhold(ns)
        return n

    def _hold(self, ns: int) -> None:
        """The native fast path leaves `ns` to Python (its mirror still holds the cleared keys): the
        namespace's tenant cell reads HELD, which no ring's is. Without tenants the cells are made at
        the first clear (the fast path then checks them on every request)."""
        if self._ns_slot is None:
            self._make_ns_cells()
            self._attach_room()
        self._set_ns_slot(ns, HELD)

    def _unhold(self, ns: int) -> None:
        """After a clear of `ns` ends: its tenant's cell again, unless another clear of it goes on."""
        if any(n == ns for n, _rest in self._clearing):
            return
        tenant = self._ns_tenant.get(ns)
        self._set_ns_slot(ns, tenant.slot if tenant is not None else -1)

    @property
    def background(self) -> bool:
        """Work waiting for the server's turns: a clear to finish, a watermark sweep, the journal's rewrite."""
        j = self.journal
        return bool(self._clearing) or self.sweeping or (j is not None and j.compacting)

    def background_step(self) -> int:
        """One bounded step of that work (a clear step, a sweep step, a rewrite step); how many
        entries it handled."""
        n = self.clear_step() if self._clearing else 0
        if self.sweeping:
            n += self.evict_step()
        j = self.journal
        if j is not None and j.compacting:
            n += j.compact_step()
        return n

    def evict_step(self, budget: int = EVICT_STEP) -> int:
        """One step of the watermark sweep: at most `budget` evictions. The sweep ends when usage is
        under the low watermark or nothing more can be evicted (all leased); the next commit past the
        high watermark starts another."""
        n = self.evict(budget=budget)
        if n < budget:
            self.sweeping = False
        return n

    def _remove(self, e: Entry, why: int) -> None:
        ns, key = e.key
        visible = self._ns_keys.get(ns)
        if visible is not None and visible.get(key) is e:
            visible.pop(key)
        else:
            self._cleared_live -= 1  # a cleared entry (its namespace's map no longer has it)
        del self.entries[e.key]
        self._slab_del(e)
        tenant = self._ns_tenant[ns]
        if tenant.lru.discard(e):
            tenant.stored_bytes -= e.alloc.nbytes
            if why == WHY_EVICTED:
                tenant.evicted += 1
                tenant.evicted_bytes += e.alloc.footprint
        if self.mirror is not None:
            self._mirror_del(self.mirror, e.key[0], e.key[1])
        self._finish_removal(e, why)

    def _finish_removal(self, e: Entry, why: int) -> None:
        """What follows an entry's leaving the lookups: journal, removal log, its blocks."""
        if self.journal is not None:
            self.journal.removed(e)
        self.removals.record(e.key[0], e.key[1], why)
        self._ns_sub(e.key[0])
        if e.leases:
            e.dead = True  # stays in by_id: lease bursts name it by id until they end
        else:
            self.by_id.pop(e.id, None)
            self._free(e.alloc)

    def drop(self, e: Entry) -> None:
        """Remove a committed entry as its deletion would (a standby following a REMOVE)."""
        self._remove(e, WHY_DELETED)

    def id_mark(self) -> int:
        """An entry id that every entry made from now on exceeds (and none made before reaches)."""
        return next(self._entry_ids)

    def _slab_add(self, e: Entry) -> None:
        if self._free_slots:
            e.slot = self._free_slots.pop()
            self.slab[e.slot] = e
        else:
            e.slot = len(self.slab)
            self.slab.append(e)

    def _slab_del(self, e: Entry) -> None:
        self.slab[e.slot] = None
        self._free_slots.append(e.slot)
        e.slot = -1

    def _place(self, e: Entry) -> None:
        one = e.alloc.single
        if one is not None:  # most entries: no list made
            if one[0] < CHUNK:
                self._at[one[1] >> BLOCK_SHIFT] = e
            return
        at = self._at
        for size, off in e.alloc.blocks:
            if size < CHUNK:
                at[off >> BLOCK_SHIFT] = e

    def _free(self, a: Allocation) -> None:
        at = self._at
        for size, off in a.blocks:
            if size < CHUNK:
                at.pop(off >> BLOCK_SHIFT, None)
        if self._zero is not None and self.config.zero_on_free:
            for off, n in a.extents:
                self._zero(off, n)
        self.alloc.free(a)

    # --- housekeeping -------------------------------------------------------------------------
    def evict(self, target_free: int = 0, budget: int | None = None) -> int:
        """Evict cold unleased entries until usage is under the low watermark and `target_free` fits,
        or `budget` entries are gone."""
        cap = self.alloc.capacity
        goal_used = min(self.config.low_watermark * cap, cap - target_free)
        evicted = 0
        if self.alloc.used <= goal_used:
            return 0
        spent: set[int] = set()  # tenants with nothing evictable within EVICT_SCAN
        while self.alloc.used > goal_used and (budget is None or evicted < budget):
            t = self._victim_tenant(spent)
            if t is None:
                break
            e = self._coldest_unleased(t)
            if e is None:
                spent.add(t.id)
                continue
            self.counters.evicted_bytes += e.alloc.footprint
            self._remove(e, WHY_EVICTED)
            evicted += 1
        self.counters.evictions += evicted
        return evicted

    def _coldest_unleased(self, t: Tenant) -> Entry | None:
        for i, e in enumerate(t.lru.values()):
            if not e.leases:
                return e
            if i >= EVICT_SCAN:
                break
        return None

    def _victim_tenant(self, spent: set[int], planned: dict[int, int] | None = None, me: Tenant | None = None):
        """The tenant to evict from next: the one furthest above its weighted share of the area
        (share = capacity x weight / the weights of the tenants holding blocks), counting what is
        already `planned` for eviction. With `me` (a reservation's tenant), only tenants above their
        share, or `me` itself, are candidates: a tenant's writes never push another below its share."""
        ts = self.tenants.all
        if len(ts) == 1:
            t = ts[0]
            return t if t.lru and t.id not in spent else None
        holders = [t for t in ts if t.lru and t.id not in spent]
        if not holders:
            return None
        wsum = sum(t.weight for t in holders)
        cap = self.alloc.capacity
        best, best_over = None, 0.0
        for t in holders:
            over = t.stored_bytes - (planned.get(t.id, 0) if planned else 0) - cap * t.weight / wsum
            if me is not None and over <= 0 and t is not me:
                continue
            if best is None or over > best_over:
                best, best_over = t, over
        return best

    def _evict_own(self, tenant: Tenant, nbytes: int) -> None:
        """Evict up to EVICT_SCAN of `tenant`'s own coldest unleased blocks, until `nbytes` are gone."""
        freed = 0
        victims = []
        for i, e in enumerate(tenant.lru.values()):
            if freed >= nbytes or i >= EVICT_SCAN:
                break
            if e.leases:
                continue
            victims.append(e)
            freed += e.alloc.nbytes
        for e in victims:
            self.counters.evicted_bytes += e.alloc.footprint
            self._remove(e, WHY_EVICTED)
        self.counters.evictions += len(victims)

    def _evict_for(self, nbytes: int, me: Tenant | None = None) -> Allocation | None:
        """Evict the coldest unleased entries whose space lets `nbytes` allocate, then allocate.

        The allocator's planner says beforehand which entries that takes (a size class can be
        starved while bytes are free, and freed blocks help only once their chunk empties); when
        no set of evictions would do, nothing is evicted. Two plans: emptying whole chunks, each
        holding one of the coldest blocks (`_plan_chunks`), and the LRU's cold end in order; the LRU's
        is taken when it needs no more victims than the chunks' (the usual case: a block of the same
        size fits where one cold block was). A request that needs a free chunk in a pool of small
        blocks empties one chunk: in LRU order that took a third of the cache (issue 31). With no
        chunk that can be emptied (each holds a leased or reserved block) the LRU walk goes on to
        the end.
        """
        plan = self.alloc.fit_planner(nbytes)
        victims: list[Entry] | None = []
        if not plan.fits():
            by_chunk = self._plan_chunks(nbytes, me)
            victims, cut = self._plan_lru(plan, me, len(by_chunk) if by_chunk is not None else None)
            if victims is None and cut:
                victims = by_chunk
            if victims is None:
                self.counters.evictions_refused += 1
                return None
        for e in victims:
            self.counters.evicted_bytes += e.alloc.footprint
            self._remove(e, WHY_EVICTED)
        self.counters.evictions += len(victims)
        return self.alloc.alloc(nbytes)

    def _plan_lru(self, plan: FitPlanner, me: Tenant | None, limit: int | None) -> tuple[list[Entry] | None, bool]:
        """The coldest unleased entries (fairly, with tenants) whose removal makes `plan` fit:
        (them, False); (None, True) when `limit` victims were not enough; (None, False) when no
        number would do."""
        victims: list[Entry] = []
        if not self.tenants.named:
            for e in self.lru.values():
                if e.leases:
                    continue
                if limit is not None and len(victims) >= limit:
                    return None, True
                victims.append(e)
                if plan.add(e.alloc.blocks):
                    return victims, False
            return None, False
        # Fair: each next victim is the coldest unleased block of the tenant furthest above
        # its share (or of `me`), counting the victims already planned.
        walkers = {t.id: iter(t.lru.values()) for t in self.tenants.all if t.lru}
        planned: dict[int, int] = {}
        spent: set[int] = set()
        while True:
            t = self._victim_tenant(spent, planned, me)
            if t is None:
                return None, False
            e = next((x for x in walkers[t.id] if not x.leases), None)
            if e is None:
                spent.add(t.id)
                continue
            if limit is not None and len(victims) >= limit:
                return None, True
            victims.append(e)
            planned[t.id] = planned.get(t.id, 0) + e.alloc.nbytes
            if plan.add(e.alloc.blocks):
                return victims, False

    def _plan_chunks(self, nbytes: int, me: Tenant | None) -> list[Entry] | None:
        """Victims that empty whole chunks: for each cold unleased entry (EVICT_SCAN at most of each
        LRU it may take from), itself when it holds whole chunks, else every entry in its small
        block's chunk, provided all of them may be evicted (none leased, pending or of a tenant this
        request may not evict: then the chunk is passed over). None when no such set makes room."""
        plan = self.alloc.fit_planner(nbytes)
        a = self.alloc
        may = self._evictable_tenants(me)
        seen: set[int] = set()
        victims: list[Entry] = []
        for t in may:
            looked = 0
            for e in t.lru.values():
                if looked >= EVICT_SCAN:
                    break
                looked += 1
                if e.leases:
                    continue
                small = [(size, off) for size, off in e.alloc.blocks if size < CHUNK]
                if len(small) < len(e.alloc.blocks) or not small:
                    group = [e]  # holds whole chunks: evicting it frees them
                else:
                    size, off = small[0]
                    chunk = a._chunk_of(off)
                    if chunk in seen:
                        continue
                    seen.add(chunk)
                    group = self._chunk_victims(chunk, size, may)
                    if group is None:
                        continue
                for v in group:
                    victims.append(v)
                    if plan.add(v.alloc.blocks):
                        return victims
        return None

    def _evictable_tenants(self, me: Tenant | None) -> list[Tenant]:
        """Whose blocks a reservation of `me` may evict: with tenants, those above their weighted
        share (furthest first) and `me`; without, the one implicit tenant."""
        if not self.tenants.named:
            return [self.tenants.default]
        holders = [t for t in self.tenants.all if t.lru]
        wsum = sum(t.weight for t in holders) or 1
        cap = self.alloc.capacity
        over = sorted(((t.stored_bytes - cap * t.weight / wsum, t) for t in holders), key=lambda x: -x[0])
        return [t for o, t in over if o > 0 or t is me]

    def _chunk_victims(self, chunk: int, size: int, may: list[Tenant]) -> list[Entry] | None:
        """Every entry with a block in `chunk` (carved into blocks of `size`), if evicting them all
        empties it; None when a block there is leased, reserved, being removed or not evictable."""
        a = self.alloc
        if chunk in a.quarantined:
            return None
        free = set(a._partial[size][a.zone_of(chunk)].get(chunk >> CHUNK_SHIFT, ()))
        at, entries, allowed = self._at, self.entries, {t.id for t in may}
        group: list[Entry] = []
        for off in range(chunk, chunk + CHUNK // size * size, size):
            if off in free:
                continue
            e = at.get(off >> BLOCK_SHIFT)
            if e is None or e.leases or entries.get(e.key) is not e:
                return None
            if self._ns_tenant[e.key[0]].id not in allowed:
                return None
            group.append(e)
        return group

    def expire(self) -> None:
        """Reclaim timed-out reservations and leases; call a few times a second."""
        now = self.clock()
        pq = self._pending_q
        while pq and pq[0][0] <= now:
            _, token = pq.popleft()
            if token in self.pending:
                self._reclaim(token)
        lq = self._lease_q
        while lq and lq[0][0] <= now:
            _, lid = lq.popleft()
            lease = self.leases.pop(lid, None)
            if lease is not None:
                self._lease_ended(lid)
                self._drop_lease(lease)
                self.counters.leases_expired += 1
        bursts = self._bursts
        while self._burst_head < len(bursts) and bursts[self._burst_head].deadline <= now:
            burst = bursts[self._burst_head]
            if burst.table is None:
                words = memoryview(burst.per_entry).cast("q").tolist()
                for i in range(0, len(words), 2):
                    if words[i] >= 0:  # (-1 - ring, n) pairs: the rings' counts, below
                        self._unlease(self.by_id[words[i]], words[i + 1])
            else:
                for _ring, ids in burst.table.values():
                    for x in ids:
                        self._unlease(self.by_id[x], 1)
            for ring, n in burst.rings.items():
                if n:
                    self._burst_leases_ended(ring, n)
            self.burst_leases -= burst.live
            self.counters.leases_expired += burst.live
            self._burst_head += 1
        if self._burst_head > 1024 and 2 * self._burst_head > len(bursts):
            del bursts[: self._burst_head]
            del self._burst_first[: self._burst_head]
            self._burst_head = 0
        self.quotas.prune()

    def _reclaim(self, token: int) -> None:
        p = self.pending.pop(token)
        del self.pending_keys[p.key]
        self._unreserve(p)
        self.counters.reservations_reclaimed += 1
        self._ns_sub(p.key[0])
        self._free(p.alloc)

    def _tenant_stats(self) -> dict[str, object]:
        out = self.tenants.stats()
        room = self.room
        if room is not None:  # what the native fast path refused (it answered misses) counts too
            for t in self.tenants.all:
                if n := room.refused(t):
                    out[t.name or "_implicit"]["refused"]["leases"] += n  # type: ignore[index]
        return out

    def stats(self) -> dict[str, object]:
        a = self.alloc.stats()
        reserved = self.reserved_footprint  # a running sum: STATS never walks the reservations
        return {
            "entries": len(self.entries) - self._cleared_live,
            "namespaces": len(self.namespaces),
            "bytes_capacity": a["capacity"],
            "bytes_used": a["used"],
            "bytes_free": a["free"],
            "bytes_reserved": reserved,
            "reservations": len(self.pending),
            "leases": len(self.leases) + self.burst_leases,
            "removals_head": self.removals.head,
            "removals_kept": len(self.removals),
            "clearing": self._cleared_live,
            "sweeping": self.sweeping,
            "quotas": self.quotas.stats(),
            "tenants": self._tenant_stats(),
            "allocator": a,
            **{k: v for k, v in vars(self.counters).items()},
        }

    def drop_overlapping(self, candidates: Sequence[Entry], hits: Callable[[Allocation], bool]) -> int:
        """Remove each of `candidates` still visible whose allocation `hits` names (poisoned lines:
        mds/poison.py hands a bounded slice of its scan each loop turn). Like a DELETE: journal,
        removal log (WHY_DELETED, a KV event), mirror; a leased block leaves every lookup at once and
        its space is freed when its leases end. Returns how many it removed."""
        dropped = 0
        entries = self.entries
        for e in candidates:
            if entries.get(e.key) is e and hits(e.alloc):
                self._remove(e, WHY_DELETED)
                dropped += 1
        return dropped
