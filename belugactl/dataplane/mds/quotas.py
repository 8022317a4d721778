"""Per-owner caps: what one ring or connection may hold at once, so none can take the server.

An owner (a CXL ring or a TCP connection, mds/ownership.py) gets one `Quota`: its live read
leases, the bytes of its pending reservations and the namespaces it created, against the limits
it was given. Every owner gets the same defaults (`QuotaLimits.defaults`, the one place they are
set); a tenant's manifest quota can later hand its owners a `Quota` with other limits
(`Quotas.assign`) without touching the index.

What each cap does when it is reached (the graceful answer a KV cache can give):
- live leases: the lookup or GET answers a miss (the reader recomputes; counted as refused);
- reserved bytes: the reservation answers POOL_FULL before anything is evicted for it;
- namespaces: opening one more answers NS_LIMIT (other owners can still open theirs).
Leases granted by the native fast path (CXL rings, in C) count too: the C path grants a ring a
lease only while its owner's and its tenant's room (`LeaseRoom`) is above zero, and leaves the
request to Python (which answers a miss) once it is not.

Tenants (the manifest's `tenants:`; docs/dataplane.md, "Tenants") sit above the owners: every owner
belongs to one tenant (a ring: its instance's; a connection: the one its HELLO named, or the one its
authentication bound it to; else the implicit tenant, id 0, which has no limits of its own). A
tenant's limits bound the sum over its owners: live leases (a miss), reserved bytes (QUOTA), stored
bytes (its own coldest blocks are evicted first, then QUOTA), connections (HELLO answers QUOTA) and
namespaces (QUOTA). Its weight is its fair share of the shared KV area under pressure (index.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from belugactl.dataplane.mds.sharded import GenerationLRU


@dataclass(frozen=True)
class QuotaLimits:
    live_leases: int
    reserved_bytes: int
    namespaces: int

    @classmethod
    def defaults(cls, capacity: int, max_namespaces: int, live_leases: int | None = None) -> QuotaLimits:
        # A quarter of the area pending per owner: several writers still fit at once, and a
        # reservation flood cannot evict every other tenant's blocks. An eighth of the namespace
        # table per owner: a churning client leaves room for the others. Small pools and tables
        # (tests, a laptop) keep a floor, so one client can still use all of them.
        return cls(
            live_leases=DEFAULT_LIVE_LEASES if live_leases is None else live_leases,
            reserved_bytes=max(capacity // 4, min(capacity, RESERVED_FLOOR)),
            namespaces=max(max_namespaces // 8, min(max_namespaces, NAMESPACES_FLOOR)),
        )


# A reader holds a lease per lookup for at most the lease TTL; an honest one releases it once its
# copy is done, so tens of thousands live at once is already a client that does not.
DEFAULT_LIVE_LEASES = 32768
RESERVED_FLOOR = 256 << 20
NAMESPACES_FLOOR = 64


class Quota:
    __slots__ = ("limits", "live_leases", "reserved_bytes", "namespaces", "owner")

    def __init__(self, limits: QuotaLimits, owner: int = -1) -> None:
        self.limits = limits
        self.live_leases = 0
        self.reserved_bytes = 0
        self.namespaces = 0
        self.owner = owner

    @property
    def idle(self) -> bool:
        return not (self.live_leases or self.reserved_bytes or self.namespaces)


@dataclass
class QuotaRefusals:
    leases: int = 0
    reserved_bytes: int = 0
    namespaces: int = 0


class Quotas:
    """owner -> Quota, made on first use with the default limits; idle ones are pruned."""

    def __init__(self, limits: QuotaLimits) -> None:
        self.limits = limits
        self._by_owner: dict[int, Quota] = {}
        self._assigned: dict[int, QuotaLimits] = {}
        self.refused = QuotaRefusals()

    def of(self, owner: int) -> Quota:
        q = self._by_owner.get(owner)
        if q is None:
            q = self._by_owner[owner] = Quota(self._assigned.get(owner, self.limits), owner)
        return q

    def assign(self, owner: int, limits: QuotaLimits) -> None:
        """Other limits for one owner (a tenant's quota); applies to what it asks from now on."""
        self._assigned[owner] = limits
        self.of(owner).limits = limits

    def prune(self) -> None:
        """Forget owners that hold nothing (connection numbers come and go)."""
        if len(self._by_owner) > 256:
            for owner in [o for o, q in self._by_owner.items() if q.idle and o not in self._assigned]:
                del self._by_owner[owner]

    def __len__(self) -> int:
        return len(self._by_owner)

    def stats(self) -> dict[str, object]:
        lim = self.limits
        return {
            "owners": len(self._by_owner),
            "limits": {
                "live_leases": lim.live_leases,
                "reserved_bytes": lim.reserved_bytes,
                "namespaces": lim.namespaces,
            },
            "refused": vars(self.refused).copy(),
        }


UNLIMITED = 1 << 62


@dataclass(frozen=True)
class TenantSpec:
    """What the manifest says of one tenant (model/tenants.py builds these; 0: no limit)."""

    name: str
    weight: int = 1
    live_leases: int = 0
    reserved_bytes: int = 0
    stored_bytes: int = 0
    connections: int = 0
    namespaces: int = 0


class Tenant:
    """One tenant's limits, what its owners hold together, its own LRU of committed blocks and its
    counters. Id 0 is the implicit tenant (everything when the manifest names none)."""

    __slots__ = (
        "id", "name", "weight", "max_leases", "max_reserved", "max_stored", "max_connections",
        "max_namespaces", "live_leases", "reserved_bytes", "stored_bytes", "connections", "namespaces",
        "lru", "refused", "evicted", "evicted_bytes", "slot",
    )  # fmt: skip

    def __init__(self, tid: int, spec: TenantSpec) -> None:
        self.id = tid
        self.name = spec.name
        self.weight = max(1, spec.weight)
        self.max_leases = spec.live_leases or UNLIMITED
        self.max_reserved = spec.reserved_bytes or UNLIMITED
        self.max_stored = spec.stored_bytes or UNLIMITED
        self.max_connections = spec.connections or UNLIMITED
        self.max_namespaces = spec.namespaces or UNLIMITED
        self.live_leases = 0
        self.reserved_bytes = 0
        self.stored_bytes = 0
        self.connections = 0
        self.namespaces = 0
        self.lru = GenerationLRU()  # its committed, live entries; cold end first
        self.refused = {"leases": 0, "reserved_bytes": 0, "stored_bytes": 0, "connections": 0, "namespaces": 0}
        self.evicted = 0
        self.evicted_bytes = 0
        self.slot = -1  # its cell in LeaseRoom (set by the room)

    def stats(self) -> dict[str, object]:
        def lim(v: int) -> int | None:
            return None if v >= UNLIMITED else v

        return {
            "weight": self.weight,
            "live_leases": self.live_leases,
            "reserved_bytes": self.reserved_bytes,
            "stored_bytes": self.stored_bytes,
            "connections": self.connections,
            "namespaces": self.namespaces,
            "entries": len(self.lru),
            "evictions": self.evicted,
            "evicted_bytes": self.evicted_bytes,
            "limits": {
                "live_leases": lim(self.max_leases),
                "reserved_bytes": lim(self.max_reserved),
                "stored_bytes": lim(self.max_stored),
                "connections": lim(self.max_connections),
                "namespaces": lim(self.max_namespaces),
            },
            "refused": dict(self.refused),
        }


class Tenants:
    """The tenants (0: the implicit one, then the manifest's in order) and which owner is whose."""

    def __init__(self, specs: tuple[TenantSpec, ...] | list[TenantSpec] = ()) -> None:
        self.all: list[Tenant] = [Tenant(0, TenantSpec(""))]
        self.by_name: dict[str, Tenant] = {"": self.all[0]}
        for spec in specs:
            if spec.name in self.by_name:
                raise ValueError(f"tenant {spec.name!r} is named twice")
            t = Tenant(len(self.all), spec)
            self.all.append(t)
            self.by_name[spec.name] = t
        self.default = self.all[0]
        self.named = len(self.all) > 1
        self._of_owner: dict[int, Tenant] = {}
        self.bound: dict[int, Tenant] = {}  # owners an authentication bound to a tenant
        self.counted: dict[int, Tenant] = {}  # TCP owners counted in their tenant's connections

    def of(self, owner: int) -> Tenant:
        return self._of_owner.get(owner, self.default)

    def assign(self, owner: int, tenant: Tenant) -> None:
        if tenant is self.default:
            self._of_owner.pop(owner, None)
        else:
            self._of_owner[owner] = tenant

    def forget(self, owner: int) -> None:
        """A connection closed: its number may go to another one, which must not inherit its tenant."""
        self._of_owner.pop(owner, None)
        self.bound.pop(owner, None)
        t = self.counted.pop(owner, None)
        if t is not None:
            t.connections -= 1

    def stats(self) -> dict[str, object]:
        return {(t.name or "_implicit"): t.stats() for t in self.all}


class LeaseRoom:
    """How many more leases each ring and each tenant may get, as one int64 array the native fast
    path reads and decrements as it grants (cells 0..rings-1: the rings; then one per tenant; then
    one per tenant counting the lookups C answered as misses for lack of room) and `ring_slot`
    (int64 per ring: its tenant's cell). The Python index writes a cell whenever the count behind it
    changes, so the array is exact whenever the fast path runs."""

    def __init__(self, rings: int, tenants: Tenants, ring_tenant: dict[int, Tenant], ring_limit: int) -> None:
        from array import array

        self.rings = rings
        self.room = array("q", [ring_limit] * rings + [t.max_leases for t in tenants.all] + [0] * len(tenants.all))
        self.tenants = len(tenants.all)
        for t in tenants.all:
            t.slot = rings + t.id
        self.ring_slot = array("q", [ring_tenant.get(r, tenants.default).slot for r in range(rings)])

    def owner(self, q: Quota) -> None:
        if 0 <= q.owner < self.rings:
            self.room[q.owner] = q.limits.live_leases - q.live_leases

    def tenant(self, t: Tenant) -> None:
        self.room[t.slot] = t.max_leases - t.live_leases

    def refused(self, t: Tenant) -> int:
        """Leases the native fast path refused `t`'s rings (answered as misses)."""
        return self.room[t.slot + self.tenants]
