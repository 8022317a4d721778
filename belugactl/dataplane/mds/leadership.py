"""Leadership through etcd: which metadata server of a rack may serve the pool, and until when.

The servers of one rack (a leader and its standbys, on different hosts, on the same pool) take part
in one election. Each holds an etcd lease with a short TTL (5 s by default) and campaigns by creating
the leader key bound to that lease in a transaction that succeeds only where the key is absent
(`create_revision == 0`). The winner keeps its lease alive from a thread; a standby polls the key and
campaigns again once it is gone (the leader's lease lapsed, or it revoked it on a clean stop).

Safety rests on the leader's own deadline, not on etcd telling it anything:
- A keep-alive (or the grant) sent at local monotonic time `t` proves the lease lives on etcd until
  at least `t + TTL` on etcd's clock: etcd restarts the TTL when it handles the request, after `t`.
- So the leader may act until `deadline = t_last_ok + TTL - margin`; the margin covers the two
  clocks' drift over one TTL and the last step of a loop turn (`margin_s`, 1 s for 5 s by default).
- `holds()` is that comparison (one monotonic clock read), made by the server loop at every turn
  and at every housekeeping, before the turn's writes. Past the deadline the term is over for good:
  a keep-alive that succeeds later does not bring it back (the server stepped down, its index is
  stale); the process campaigns again from scratch as a standby.
- A leader paused (SIGSTOP, a VM freeze, a swap storm) for longer than the margin finds its deadline
  passed when it resumes, and stops before its next turn's writes. The new leader fenced it anyway:
  it bumps the pool epoch once it holds the lease, so the old one's clients, leases and reservations
  are void (STALE_EPOCH), and the old one sees the epoch changed at its next housekeeping.

Why etcd3gw (OpenStack's client of etcd's v3 JSON gateway): pure Python over `requests` (no gRPC
wheels to build on a rack host), maintained, and it exposes what the deadline needs: the lease grant
and each keep-alive as one request whose sending time we know. tooz's election (over etcd3gw) hides
the keep-alive timing behind its own heartbeat, so the leader could not compute its deadline; aetcd
is asyncio (the server loop is not); etcd3 is unmaintained since 2020.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

DEFAULT_TTL_S = 5.0
MAX_TTL_S = 5.0  # issue 32: the lease TTL is at most 5 s by default (a longer one is a longer failover)


class EtcdUnavailable(Exception):
    """No endpoint answered (or one answered with an error): nothing was decided."""


@dataclass(frozen=True)
class KeyInfo:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


class EtcdKV(Protocol):
    """The five etcd calls the election makes (a real cluster: `Etcd3gwKV`; unit tests: a fake)."""

    def grant(self, ttl: int) -> tuple[int, int]: ...  # (lease id, granted TTL)
    def keepalive(self, lease: int) -> int: ...  # the lease's TTL now, <= 0: gone
    def create(self, key: str, value: bytes, lease: int) -> int: ...  # revision created, 0: key exists
    def get(self, key: str) -> KeyInfo | None: ...
    def revoke(self, lease: int) -> None: ...


def parse_endpoints(text: str | Sequence[str]) -> list[str]:
    """`http://h:2379,http://h2:2379` (or a list) -> normalised base URLs; ValueError says what is wrong."""
    items = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    if not items:
        raise ValueError("no etcd endpoint given")
    out = []
    for item in items:
        if "://" not in item:
            item = "http://" + item
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{item!r} is not an etcd endpoint (http://HOST:PORT)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{item!r}: an etcd endpoint is a scheme, host and port only")
        try:
            port = parts.port or 2379
        except ValueError:
            raise ValueError(f"{item!r} has no valid port") from None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        out.append(f"{parts.scheme}://{host}:{port}")
    return out


class Etcd3gwKV:
    """EtcdKV over etcd3gw (the v3 JSON gateway), trying each endpoint in turn.

    Every request has `timeout_s` (at most a third of the TTL, so a hung endpoint costs a leader one
    keep-alive, never its term while another endpoint answers)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 1.0) -> None:
        import etcd3gw

        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._clients = []
        for url in self.endpoints:
            p = urlsplit(url)
            self._clients.append(
                etcd3gw.Etcd3Client(
                    host=p.hostname, port=p.port or 2379, protocol=p.scheme, timeout=timeout_s, api_path="/v3/"
                )
            )
        self._first = 0  # the endpoint that answered last is asked first

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        from etcd3gw import exceptions

        last: Exception | None = None
        n = len(self._clients)
        for i in range(n):
            k = (self._first + i) % n
            try:
                out = fn(self._clients[k])
            except (exceptions.Etcd3Exception, OSError, ValueError, KeyError) as exc:
                last = exc
                continue
            self._first = k
            return out
        raise EtcdUnavailable(f"no etcd endpoint answered ({', '.join(self.endpoints)}): {last}")

    def grant(self, ttl: int) -> tuple[int, int]:
        def do(c: Any) -> tuple[int, int]:
            r = c.post(c.get_url("/lease/grant"), json={"TTL": ttl, "ID": 0})
            return int(r["ID"]), int(r.get("TTL", ttl))

        return self._call(do)

    def keepalive(self, lease: int) -> int:
        def do(c: Any) -> int:
            r = c.post(c.get_url("/lease/keepalive"), json={"ID": lease})
            return int(r.get("result", {}).get("TTL", -1))

        return self._call(do)

    def create(self, key: str, value: bytes, lease: int) -> int:
        from etcd3gw.utils import _encode

        k = _encode(key)
        txn = {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": k, "value": _encode(value), "lease": lease}}],
            "failure": [],
        }

        def do(c: Any) -> int:
            r = c.transaction(txn)
            return int(r["header"]["revision"]) if r.get("succeeded") else 0

        return self._call(do)

    def get(self, key: str) -> KeyInfo | None:
        def do(c: Any) -> KeyInfo | None:
            got = c.get(key, metadata=True)
            if not got:
                return None
            value, meta = got[0]
            return KeyInfo(
                value=value,
                create_revision=int(meta.get("create_revision", 0)),
                mod_revision=int(meta.get("mod_revision", 0)),
                lease=int(meta.get("lease", 0)),
            )

        return self._call(do)

    def revoke(self, lease: int) -> None:
        self._call(lambda c: c.post(c.get_url("/kv/lease/revoke"), json={"ID": lease}))


@dataclass(frozen=True)
class Leader:
    """Who leads, as the leader key says."""

    member: str
    since: float  # wall-clock seconds when it won (its own clock)
    revision: int  # etcd's create revision of the key: grows with every term
    pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "since": self.since, "revision": self.revision, "pid": self.pid}


def leader_key(rack: str) -> str:
    return f"/belugactl/{rack}/metadata/leader"


@dataclass
class Elector:
    """One member's part in the election. Not thread-safe except `holds()`, `remaining()` and `stats()`,
    which the server loop and the admin thread call while the keep-alive thread runs `keep_once()`."""

    kv: EtcdKV
    member: str
    key: str
    ttl_s: float = DEFAULT_TTL_S
    margin_s: float | None = None  # None: max(0.5 s, 20 % of the TTL)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    lease: int = 0
    deadline: float = 0.0  # monotonic; 0: not leading
    term_revision: int = 0
    since: float = 0.0
    lost_reason: str = ""
    changes_seen: int = 0  # leader changes this member saw (its own wins included)
    terms_won: int = 0
    last_leader: Leader | None = None
    _last_revision: int = 0
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.ttl_s <= 3600:
            raise ValueError(f"leader TTL {self.ttl_s:g} s is outside (0, 3600]")
        if self.margin_s is None:
            self.margin_s = max(0.5, 0.2 * self.ttl_s)
        if not 0 < self.margin_s < self.ttl_s:
            raise ValueError(f"margin {self.margin_s:g} s must be above 0 and below the TTL {self.ttl_s:g} s")

    # --- the term -------------------------------------------------------------------------------
    def holds(self) -> bool:
        """Leading, and certainly still the only one: before our own deadline. One clock read."""
        return self.clock() < self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock())

    @property
    def keepalive_every_s(self) -> float:
        return self.ttl_s / 3

    def _extend(self, sent_at: float, ttl: float) -> None:
        self.deadline = sent_at + min(float(ttl), self.ttl_s) - (self.margin_s or 0.0)

    def campaign(self) -> bool:
        """Try to become the leader: a fresh lease, then create the key bound to it if absent.
        True: we lead until `deadline` (kept alive by `keep_once`). EtcdUnavailable: nothing decided."""
        if self.deadline:
            raise RuntimeError("campaign while a term is open: step down first")
        ttl = max(1, round(self.ttl_s))
        sent = self.clock()
        lease, granted = self.kv.grant(ttl)
        value = json.dumps({"member": self.member, "since": self.wall(), "pid": os.getpid()}).encode()
        try:
            revision = self.kv.create(self.key, value, lease)
        except BaseException:
            self._revoke_quietly(lease)
            raise
        if not revision:
            self._revoke_quietly(lease)
            self.observe()
            return False
        if self.clock() >= sent + min(granted, self.ttl_s) - (self.margin_s or 0.0):
            # The create took so long that the lease may lapse before we could act: give it back.
            self._revoke_quietly(lease)
            return False
        self.lease = lease
        self.term_revision = revision
        self.since = self.wall()
        self.lost_reason = ""
        self.terms_won += 1
        self._extend(sent, granted)
        self._note(Leader(self.member, self.since, revision, os.getpid()))
        return True

    def keep_once(self) -> bool:
        """One keep-alive (and a look that the key is still ours); False once the term is over."""
        if not self.deadline:
            return False
        sent = self.clock()
        if sent >= self.deadline:
            return self.end_term("deadline passed before a keep-alive succeeded")
        try:
            ttl = self.kv.keepalive(self.lease)
            info = self.kv.get(self.key) if ttl > 0 else None
        except EtcdUnavailable:
            return self.holds() or self.end_term("etcd unreachable until the deadline")
        if ttl <= 0:
            return self.end_term("the lease expired on etcd")
        if info is None or info.lease != self.lease:
            return self.end_term("the leader key is gone or no longer ours")
        if self.clock() >= self.deadline:
            # Too late: we may already have stopped at the deadline; a term never comes back.
            return self.end_term("keep-alive answered after the deadline")
        self._extend(sent, ttl)
        return True

    def end_term(self, reason: str) -> bool:
        """Stop leading (the server loop stops at its next `holds()`); the lease is revoked if etcd
        answers, so a standby need not wait out the TTL."""
        lease, self.lease = self.lease, 0
        self.deadline = 0.0
        self.lost_reason = reason
        self.term_revision = 0
        if lease:
            self._revoke_quietly(lease)
        return False

    def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(EtcdUnavailable):  # unreachable: it lapses by itself within the TTL
            self.kv.revoke(lease)

    # --- who leads ------------------------------------------------------------------------------
    def observe(self) -> Leader | None:
        """Read the leader key (EtcdUnavailable when no endpoint answers)."""
        info = self.kv.get(self.key)
        if info is None:
            return None
        try:
            data = json.loads(info.value)
            leader = Leader(str(data["member"]), float(data["since"]), info.create_revision, int(data.get("pid", 0)))
        except (ValueError, KeyError, TypeError):
            leader = Leader("?", 0.0, info.create_revision)
        self._note(leader)
        return leader

    def _note(self, leader: Leader) -> None:
        if leader.revision != self._last_revision:
            if self._last_revision:
                self.changes_seen += 1
            self._last_revision = leader.revision
        self.last_leader = leader

    def wait_for_vacancy(self, stop: threading.Event, poll_s: float | None = None) -> bool:
        """Until the leader key is absent (True) or `stop` is set (False); etcd errors are retried."""
        poll = poll_s if poll_s is not None else min(0.25, self.ttl_s / 10)
        while not stop.is_set():
            try:
                if self.observe() is None:
                    return True
            except EtcdUnavailable:
                pass
            stop.wait(poll)
        return False

    # --- the keep-alive thread -----------------------------------------------------------------
    def start_keepalive(self) -> None:
        """Keep the lease alive from a thread: every TTL/3, retried every TTL/10 after a failure."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep_loop, name="metadata server: etcd lease", daemon=True)
        self._thread.start()

    def _keep_loop(self) -> None:
        wait = self.keepalive_every_s
        while not self._stop.wait(wait):
            before = self.deadline
            if not self.keep_once():
                return
            wait = self.keepalive_every_s if self.deadline != before else self.ttl_s / 10

    def stop_keepalive(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def resign(self) -> None:
        """A clean stop: end the term and revoke the lease, so a standby takes over at once."""
        self.stop_keepalive()
        if self.deadline:
            self.end_term("resigned (clean stop)")

    def stats(self) -> dict[str, Any]:
        leading = self.holds()
        leader = self.last_leader
        return {
            "member": self.member,
            "key": self.key,
            "leading": leading,
            "leader": leader.member if leader is not None else None,
            "leader_since": leader.since if leader is not None else None,
            "leader_revision": leader.revision if leader is not None else None,
            "leader_changes": self.changes_seen,
            "terms_won": self.terms_won,
            "ttl_s": self.ttl_s,
            "margin_s": self.margin_s,
            "deadline_in_s": round(self.remaining(), 3) if leading else None,
            "last_lost": self.lost_reason,
        }
