"""The best-effort index: the connector's way to the metadata server, never an exception into vLLM.

A KV pool is a cache. When the server is unreachable, slow, restarted (stale epoch) or full, the
right answer is "no blocks" (vLLM recomputes) and "save skipped", plus a warning and a counter, and
a new connection attempt after `retry_s`, not a failed request.

`BestEffortIndex` declares only the calls the connector makes; each one wraps the same call of
`belugactl.dataplane.client.KVIndexClient`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from belugactl.dataplane.metadata_errors import (
    AlreadyPresent,
    NotOwner,
    PoolFull,
    RequestRejected,
    ReservationExpired,
    StaleEpoch,
)
from belugactl.dataplane.rpc.protocol import LocationTuple
from vllm_beluga.stats import ConnectorStats

if TYPE_CHECKING:
    from belugactl.dataplane.client import KVIndexClient, Removals, Reservation
    from belugactl.dataplane.nowait import CopyRelease, PendingLookup

# A child of vLLM's logger, so our lines land in vLLM's log with its format and level.
log = logging.getLogger("vllm.beluga")
T = TypeVar("T")
# Errors that say something about the request, not the server: raised to the caller, the index stays up.
_RAISED: tuple[type[Exception], ...] = (PoolFull, AlreadyPresent, ReservationExpired, RequestRejected, NotOwner)


class BestEffortIndex:
    """`address` None: this process was given no server address (transport cxl without a ring for
    it); it behaves as on an unreachable server and says so, rather than borrow anyone's ring."""

    def __init__(
        self,
        address: str | None,
        *,
        stats: ConnectorStats,
        timeout_s: float = 1.0,
        retry_s: float = 5.0,
        connect: Callable[..., KVIndexClient] | None = None,
        handover_group: int = 0,
        tenant: str = "",
    ) -> None:
        self.address = address
        # Said in HELLO: the scheduler and the workers of one engine share it, so a worker may
        # release the leases its scheduler took (and no other client may).
        self.handover_group = handover_group
        self.tenant = tenant  # said in HELLO: the manifest tenant this instance is of ("" none)
        self.stats = stats
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._connect = connect
        self._client: KVIndexClient | None = None
        self._pool: Any = None  # the pool this process copies through (use_pool)
        self._retry_at = 0.0
        self._warned_down = False
        # Metadata requests sent and waits for replies, over every client this index has used (it
        # reconnects after failures); the connector reports them per saved request.
        self.messages = 0
        self.round_trips = 0
        # Which way this process talks to the server, in its stats file, so an operator (and the
        # end-to-end test) can see that every process uses its ring and none fell back to TCP.
        self.transport = address.split("://", 1)[0] if address and "://" in address else "none"
        stats.set("metadata_address", address or "")
        stats.set("metadata_transport", self.transport)

    def use_pool(self, pool: Any) -> None:
        """Hold the server to the pool this process maps (a TCP client knows no pool of its own):
        extents outside its shared KV area are refused before any copy, and a server whose epoch
        is not the header's is refused at connect (KVIndexClient.use_pool)."""
        self._pool = pool
        client = self._client
        if client is not None and client.transport.pool is None:
            client.use_pool(pool)

    @property
    def healthy(self) -> bool:
        return self._client is not None

    def _get_client(self) -> KVIndexClient | None:
        if self._client is not None:
            return self._client
        if time.monotonic() < self._retry_at:
            return None
        if self.address is None:
            self.stats.set("ring_error", "no CXL-RPC ring configured for this process")
            self._down("no CXL-RPC ring was configured for this process (transport cxl) and TCP is not used instead")
            return None
        try:
            connect = self._connect
            if connect is None:
                from belugactl.dataplane.client import connect
            extra: dict[str, Any] = {"pool": self._pool} if self._pool is not None else {}
            if self.handover_group:
                extra["handover_group"] = self.handover_group
            if self.tenant:
                extra["tenant"] = self.tenant
            self._client = connect(self.address, timeout_s=self.timeout_s, **extra)
        except Exception as exc:  # noqa: BLE001 - any failure to connect means "no pool for now"
            if self.transport == "cxl":
                # A ring that cannot be opened is not a reason to switch to TCP: misses until it opens.
                self.stats.add("ring_open_failed")
                self.stats.set("ring_error", f"{type(exc).__name__}: {exc}")
                self._down(f"cannot open CXL-RPC ring {self.address} (not falling back to TCP): {exc}")
            else:
                self._down(f"cannot connect to the metadata server at {self.address}: {exc}")
            return None
        if self._warned_down:
            log.warning("Beluga: metadata server at %s is reachable again", self.address)
        self._warned_down = False
        self.stats.set("ring_error", None)  # the ring opened: an earlier failure is history (counted)
        self.stats.set("healthy", True)
        self.stats.add("connects")
        return self._client

    def _down(self, why: str) -> None:
        self._retry_at = time.monotonic() + self.retry_s
        if self._client is not None:
            with contextlib.suppress(Exception):  # closing a broken client may fail too
                self._client.close()
        self._client = None
        self.stats.set("healthy", False)
        self.stats.add("server_unavailable")
        if not self._warned_down:
            log.warning("Beluga: %s; serving without the pool (misses, saves skipped) until it answers", why)
            self._warned_down = True

    def _call(self, what: str, default: T, fn: Callable[[KVIndexClient], T]) -> T:
        client = self._get_client()
        if client is None:
            return default
        sent, waited = client.messages, client.round_trips
        ended, refused = client.nowait_leases_ended, client.nowait_refused
        try:
            return fn(client)
        except _RAISED:
            raise
        except Exception as exc:  # noqa: BLE001
            self._failed(what, exc)
            return default
        finally:
            self.messages += client.messages - sent
            self.round_trips += client.round_trips - waited
            self._count_nowait_replies(client, ended, refused)

    def _failed(self, what: str, exc: Exception) -> None:
        """A request that failed for a reason of the server's, not the request's: the index goes down."""
        if isinstance(exc, StaleEpoch):
            # The server restarted: our leases and reservations are void; start over.
            self.stats.add("stale_epoch")
        self._down(f"{what} failed ({type(exc).__name__}: {exc})")

    def _count_nowait_replies(self, client: KVIndexClient, ended: int, refused: int) -> None:
        """What replies to no-wait RELEASEs said, taken since the client's counts were `ended` and
        `refused` (they are taken at the start of a later call)."""
        if (n := client.nowait_leases_ended - ended) > 0:
            self.stats.add("posted_release_leases_ended", n)  # the stats file's name, kept
        if (n := client.nowait_refused - refused) > 0:
            self.stats.add("release_failed", n)

    def connect_now(self) -> bool:
        """Connect now, so the first request does not pay for it; a failure is retried lazily."""
        return self._get_client() is not None

    # -- the calls the connector makes -------------------------------------------------------
    def lookup_prefix_leased(self, namespace: str, keys: Sequence[bytes]) -> tuple[int, list[int]]:
        """How many leading `keys` the pool has, and the read leases it granted on them (the found
        blocks cannot be evicted while they last): whoever asks must release them (`release`) once
        done, or they pin those blocks for the server's lease TTL."""
        if not keys:
            return 0, []
        found, leases = self._call("lookup", (0, []), lambda c: c.lookup_prefix_leased(namespace, keys))
        return int(found), list(leases)

    def get_many_tuples(self, namespace: str, keys: Sequence[bytes]) -> list[LocationTuple | None]:
        """Where each key's block is, with a read lease on it, in one burst; None per key absent
        (all None when the server is away)."""
        if not keys:
            return []
        got = self._call("get", None, lambda c: c.get_many_tuples(namespace, keys))
        return [None] * len(keys) if got is None else list(got)

    def start_lookup(self, namespace: str, keys: Sequence[bytes]) -> tuple[KVIndexClient, PendingLookup] | None:
        """`get_many_tuples` sent now, its answer taken by `finish_lookup` later (the client's
        `start_lookup`); None when nothing was sent (the transport cannot, the server is down):
        ask with `get_many_tuples` then."""
        if not keys:
            return None

        def start(c: KVIndexClient) -> tuple[KVIndexClient, PendingLookup] | None:
            pending = c.start_lookup(namespace, keys)
            return None if pending is None else (c, pending)

        return self._call("get", None, start)

    def finish_lookup(self, started: tuple[KVIndexClient, PendingLookup]) -> list[LocationTuple | None] | None:
        """The answer to a lookup `start_lookup` sent, as `get_many_tuples` answers; None when it
        cannot be had (the server went away, the ring broke): the blocks count as absent and any
        leases the answer held are lost with it, to expire on the server."""
        client, pending = started
        if client is not self._client:
            return None  # sent by a client this index has since dropped: its answer went with it
        return self._call("get", None, lambda c: c.finish_lookup(pending))

    def reserve_many(self, namespace: str, keys: Sequence[bytes], nbytes: int) -> list[Reservation | None]:
        """Reservations for a request's blocks in one burst: a Reservation or None per key (present
        already, no space, or the server is down), each skip counted by why."""
        if not keys:
            return []
        try:
            got = self._call("reserve", None, lambda c: c.reserve_many(namespace, [(k, nbytes) for k in keys]))
        except Exception as exc:  # noqa: BLE001 - the whole request was refused: no block is saved
            self.stats.add(_skip_counter(exc), len(keys))
            return [None] * len(keys)
        if got is None:
            return [None] * len(keys)
        out: list[Reservation | None] = []
        for r in got:
            if isinstance(r, int):  # the protocol's Code that refused this key
                self.stats.add(_REFUSED.get(getattr(r, "name", ""), "save_skipped_refused"))
                out.append(None)
            else:
                out.append(r)
        return out

    def finish_many(self, commits: Sequence[tuple[Any, int]], aborts: Sequence[Any]) -> list[bool]:
        """Commit (token, CRC32C) pairs and abort tokens in one burst; per commit, whether the block is
        visible now. A token the server refused (reclaimed, another owner's) counts `commit_failed`."""
        if not commits and not aborts:
            return []
        try:
            got = self._call("commit", None, lambda c: c.finish_many(list(commits), list(aborts)))
        except Exception:  # noqa: BLE001 - the reservations are reclaimed after their timeout
            self.stats.add("commit_failed", len(commits))
            return [False] * len(commits)
        if got is None:
            return [False] * len(commits)
        ok = [int(code) == 0 for code in got[0]]
        if not all(ok):
            self.stats.add("commit_failed", ok.count(False))
        return ok

    def writable(self, reservation: Reservation) -> bool:
        """May we still write into this reservation (deadline not passed, same epoch)? See fencing."""
        client = self._client
        try:
            return client is not None and bool(client.writable(reservation))
        except Exception:  # noqa: BLE001 - when in doubt, do not write
            return False

    def delete(self, namespace: str, key: bytes) -> None:
        """Drop a key (a block found corrupt), so later readers miss instead of reading it again."""
        with contextlib.suppress(Exception):  # best effort: at worst the next reader detects it too
            self._call("delete", None, lambda c: c.delete(namespace, key))

    def release(self, lease_ids: Sequence[int], *, granted_elsewhere: bool = False) -> int | None:
        """How many of the leases were still live (None: unknown, the server did not answer).

        `granted_elsewhere`: the scheduler got these leases and passed them to this worker."""
        if not lease_ids:
            return 0
        try:
            return self._call(
                "release", None, lambda c: c.release(list(lease_ids), granted_elsewhere=granted_elsewhere)
            )
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return None

    def lease_trusted_until(self, asked: float) -> float | None:
        """Until when (time.monotonic) leases of a request sent after `asked` are certainly live
        (KVIndexClient.lease_trusted_until); None: not known (no client, or an older server)."""
        client = self._client
        return client.lease_trusted_until(asked) if client is not None else None

    def release_nowait(self, lease_ids: Sequence[int] | array, *, granted_elsewhere: bool = False) -> bool:
        """Release without waiting for the live count (KVIndexClient.release_nowait). True when sent,
        or when there is no server to tell (its leases then expire on their own); False when it
        could not be sent: release them with `release` instead. An array('Q') of ids (packed
        while they were in the CPU caches) goes to the client as it is."""
        packed = isinstance(lease_ids, array)
        if not (len(lease_ids) if packed else any(lease_ids)):
            return True

        def send(c: KVIndexClient) -> bool:
            ids = lease_ids if packed else list(lease_ids)
            return bool(c.release_nowait(ids, granted_elsewhere=granted_elsewhere))

        try:
            return self._call("release", True, send)
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return True

    def release_with_copy(self, lease_ids: array, *, granted_elsewhere: bool = False) -> BestEffortCopyRelease | None:
        """`release_nowait` in two halves (KVIndexClient.release_with_copy): the release made ready
        now, sent by the caller's native call (the worker's `load_blocks_checked`, right after its
        copy), its result handed to `BestEffortCopyRelease.done`. None when it cannot go that way
        (no server, no native helper, no room in flight): use `release_nowait` or `release` after
        the copy."""

        # Not through `_call`: this runs on every pool hit, and a connection that is down or not
        # yet made is left to the usual release after the copy (which retries it).
        client = self._client
        if client is None:
            return None
        ended, refused = client.nowait_leases_ended, client.nowait_refused
        try:
            ready = client.release_with_copy(lease_ids, granted_elsewhere=granted_elsewhere)
        except Exception as exc:  # noqa: BLE001 - as `_call` takes it: the release after the copy retries
            self.release_error(exc)
            return None
        finally:
            self._count_nowait_replies(client, ended, refused)  # earlier replies it took, when their room was needed
        if ready is None:
            return None
        self.messages += ready.messages  # booked as sent; `done` takes back what was not
        return BestEffortCopyRelease(self, ready)

    def release_error(self, exc: Exception) -> bool:
        """What `_call` and `release_nowait` make of an error, for a release a native call sent:
        counted, or the index goes down; True (the leases expire on the server)."""
        if isinstance(exc, _RAISED):
            self.stats.add("release_failed")
        else:
            self._failed("release", exc)
        return True

    def release_groups(self, groups: Sequence[Sequence[int]], *, granted_elsewhere: bool = False) -> list[int] | None:
        """`release` for several sets of leases in one burst: each set's live count (None: unknown)."""
        if not any(groups):
            return [0] * len(groups)
        try:
            return self._call(
                "release",
                None,
                lambda c: c.release_groups([list(g) for g in groups], granted_elsewhere=granted_elsewhere),
            )
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return None

    def removals_since(self, namespace: str, cursor: int, epoch: int) -> tuple[Removals, bool] | None:
        """Keys of `namespace` the server removed from `cursor` on: (Removals, False), if `epoch`
        is still the server's. Otherwise (the first call with epoch 0, the server restarted since,
        or it refused the cursor): (a head query's answer, True), whose `head` is where to follow
        from and whose `epoch` is the server's. None when the server is away."""

        def ask(client: KVIndexClient) -> tuple[Removals, bool]:
            if client.epoch == epoch:
                try:
                    return client.removals_since(cursor, namespace), False
                except RequestRejected:
                    self.stats.add("removals_refused")  # a cursor this server never issued
            return client.removals_since(0, namespace, max_items=0), True

        return self._call("removals", None, ask)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


# Skip counters of a refused reservation, by the protocol's code name, as the single reserve named
# them after its exceptions (AlreadyPresent, PoolFull: TOO_BIG raised PoolFull too).
_REFUSED = {
    "EXISTS": "save_skipped_exists",
    "POOL_FULL": "save_skipped_poolfull",
    "TOO_BIG": "save_skipped_poolfull",
    "QUOTA": "save_skipped_quota",  # the instance's tenant holds its reserved or stored bytes quota
}


def _skip_counter(exc: Exception) -> str:
    """The stats file's counter for a refused reservation burst, named after its error class."""
    if isinstance(exc, AlreadyPresent):
        return "save_skipped_exists"
    return "save_skipped_" + type(exc).__name__.lower()


class BestEffortCopyRelease:
    """A release `BestEffortIndex.release_with_copy` made ready: `args` for the native call that
    sends it, `done` with that call's result. Kept to one frame and the client's `done` (two):
    it runs right after a copy, when every function touched first is out of the CPU caches."""

    __slots__ = ("index", "ready")

    def __init__(self, index: BestEffortIndex, ready: CopyRelease) -> None:
        self.index = index
        self.ready = ready

    @property
    def args(self) -> tuple:
        return self.ready.args

    def done(self, result: Any) -> bool:
        """True: sent, or refused by a server that will not hear it (the leases expire there);
        False: nothing was sent (the copy ended too late, or `result` None after the native call
        raised): release the usual way."""
        if result.__class__ is list:
            return True  # sent as booked (this runs right after the copy: touch nothing)
        index = self.index
        before = self.ready.client.messages
        try:
            return self.ready.done(result)
        except Exception as exc:  # noqa: BLE001 - a refused release leaves the leases to expire
            return index.release_error(exc)
        finally:
            index.messages += self.ready.client.messages - before
