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
Leases granted by the native fast path (CXL rings, in C) are not counted: a ring belongs to a
process on a host of the rack, authenticated by the pool's file permissions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuotaLimits:
    live_leases: int
    reserved_bytes: int
    namespaces: int

    @classmethod
    def defaults(cls, capacity: int, max_namespaces: int) -> QuotaLimits:
        # A quarter of the area pending per owner: several writers still fit at once, and a
        # reservation flood cannot evict every other tenant's blocks. An eighth of the namespace
        # table per owner: a churning client leaves room for the others. Small pools and tables
        # (tests, a laptop) keep a floor, so one client can still use all of them.
        return cls(
            live_leases=DEFAULT_LIVE_LEASES,
            reserved_bytes=max(capacity // 4, min(capacity, RESERVED_FLOOR)),
            namespaces=max(max_namespaces // 8, min(max_namespaces, NAMESPACES_FLOOR)),
        )


# A reader holds a lease per lookup for at most the lease TTL; an honest one releases it once its
# copy is done, so tens of thousands live at once is already a client that does not.
DEFAULT_LIVE_LEASES = 32768
RESERVED_FLOOR = 256 << 20
NAMESPACES_FLOOR = 64


class Quota:
    __slots__ = ("limits", "live_leases", "reserved_bytes", "namespaces")

    def __init__(self, limits: QuotaLimits) -> None:
        self.limits = limits
        self.live_leases = 0
        self.reserved_bytes = 0
        self.namespaces = 0

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
            q = self._by_owner[owner] = Quota(self._assigned.get(owner, self.limits))
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
