"""A fake etcd for the election's unit tests (dataplane/mds/leadership.py): leases that expire on a
fake clock, keys bound to them, revisions; `down` makes every call fail as an unreachable cluster."""

from __future__ import annotations

from belugactl.dataplane.mds.leadership import EtcdUnavailable, KeyInfo


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeEtcd:
    """Leases that expire on the fake clock, keys bound to them, revisions: what the election uses."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.leases: dict[int, float] = {}  # id -> expiry
        self.ttls: dict[int, int] = {}
        self.keys: dict[str, KeyInfo] = {}
        self.revision = 1
        self.next_lease = 100
        self.down = False
        self.calls: list[str] = []

    def _expire(self) -> None:
        for lid, until in list(self.leases.items()):
            if self.clock() >= until:
                del self.leases[lid]
                self.keys = {k: v for k, v in self.keys.items() if v.lease != lid}

    def _up(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise EtcdUnavailable("down")
        self._expire()

    def grant(self, ttl: int) -> tuple[int, int]:
        self._up("grant")
        self.next_lease += 1
        self.leases[self.next_lease] = self.clock() + ttl
        self.ttls[self.next_lease] = ttl
        return self.next_lease, ttl

    def keepalive(self, lease: int) -> int:
        self._up("keepalive")
        if lease not in self.leases:
            return -1
        self.leases[lease] = self.clock() + self.ttls[lease]
        return self.ttls[lease]

    def create(self, key: str, value: bytes, lease: int) -> int:
        self._up("create")
        if key in self.keys:
            return 0
        self.revision += 1
        self.keys[key] = KeyInfo(value, self.revision, self.revision, lease)
        return self.revision

    def get(self, key: str) -> KeyInfo | None:
        self._up("get")
        return self.keys.get(key)

    def revoke(self, lease: int) -> None:
        self._up("revoke")
        self.leases.pop(lease, None)
        self.keys = {k: v for k, v in self.keys.items() if v.lease != lease}
