"""The connector's door to the metadata server: best effort, never an exception into vLLM.

A KV pool is a cache. When the server is unreachable, slow, restarted (stale epoch) or full, the
right answer is "no blocks" (vLLM recomputes) and "save skipped", plus a warning and a counter, and
a new connection attempt after `retry_s`, not a failed request.
"""

from __future__ import annotations

import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from vllm_beluga.stats import ConnectorStats

# A child of vLLM's logger, so our lines land in vLLM's log with its format and level.
log = logging.getLogger("vllm.beluga")
T = TypeVar("T")
# Errors that say something about the request, not the server: raised to the caller, the door stays up.
_RAISED = ("PoolFull", "AlreadyPresent", "ReservationExpired", "RequestRejected", "NotOwner")


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
        connect: Callable[..., Any] | None = None,
    ) -> None:
        self.address = address
        self.stats = stats
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._connect = connect
        self._client: Any = None
        self._retry_at = 0.0
        self._warned_down = False
        # Metadata requests sent and waits for replies, over every client this door has used (it
        # reconnects after failures); the connector reports them per saved request.
        self.messages = 0
        self.round_trips = 0
        # Which way this process talks to the server, in its stats file, so an operator (and the
        # end-to-end test) can see that every process uses its ring and none fell back to TCP.
        self.transport = address.split("://", 1)[0] if address and "://" in address else "none"
        stats.set("metadata_address", address or "")
        stats.set("metadata_transport", self.transport)

    @property
    def healthy(self) -> bool:
        return self._client is not None

    def _get_client(self) -> Any:
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
            self._client = connect(self.address, timeout_s=self.timeout_s)
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

    def _call(self, what: str, default: T, fn: Callable[[Any], T]) -> T:
        client = self._get_client()
        if client is None:
            return default
        sent, waited = getattr(client, "messages", 0), getattr(client, "round_trips", 0)
        ended, refused = getattr(client, "posted_leases_ended", 0), getattr(client, "posted_refused", 0)
        try:
            return fn(client)
        except Exception as exc:  # noqa: BLE001
            if type(exc).__name__ in _RAISED:
                raise
            self._failed(what, exc)
            return default
        finally:
            self.messages += getattr(client, "messages", 0) - sent
            self.round_trips += getattr(client, "round_trips", 0) - waited
            self._posted_said(client, ended, refused)

    def _failed(self, what: str, exc: Exception) -> None:
        """A request that failed for a reason of the server's, not the request's: the door goes down."""
        if type(exc).__name__ == "StaleEpoch":
            # The server restarted: our leases and reservations are void; start over.
            self.stats.add("stale_epoch")
        self._down(f"{what} failed ({type(exc).__name__}: {exc})")

    def _posted_said(self, client: Any, ended: int, refused: int) -> None:
        """What replies to posted RELEASEs said, taken since the client's counts were `ended` and
        `refused` (they are taken at the start of a later call)."""
        if (n := getattr(client, "posted_leases_ended", 0) - ended) > 0:
            self.stats.add("posted_release_leases_ended", n)
        if (n := getattr(client, "posted_refused", 0) - refused) > 0:
            self.stats.add("release_failed", n)

    def warm_up(self) -> bool:
        """Connect now, so the first request does not pay for it; a failure is retried lazily."""
        return self._get_client() is not None

    # -- the calls the connector makes -------------------------------------------------------
    def lookup_prefix(self, namespace: str, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        return int(self._call("lookup", 0, lambda c: c.lookup_prefix(namespace, keys)))

    def lookup_prefix_leased(self, namespace: str, keys: Sequence[bytes]) -> tuple[int, list[int]]:
        """`lookup_prefix`, also returning the read leases it was granted (the found blocks cannot be
        evicted while they last): whoever asks must release them (`release`) once done, or they
        pin those blocks for the server's lease TTL."""
        if not keys:
            return 0, []
        found, leases = self._call("lookup", (0, []), lambda c: c.lookup_prefix_leased(namespace, keys))
        return int(found), list(leases)

    def get(self, namespace: str, key: bytes) -> Any:
        return self._call("get", None, lambda c: c.get(namespace, key))

    def get_many(self, namespace: str, keys: Sequence[bytes]) -> list[Any]:
        """`get` for a request's keys in one burst: a location (with its lease) or None per key."""
        if not keys:
            return []
        got = self._call("get", None, lambda c: c.get_many(namespace, keys))
        return [None] * len(keys) if got is None else list(got)

    def get_many_tuples(self, namespace: str, keys: Sequence[bytes]) -> list[Any]:
        """`get_many` as (extents, lease id, nbytes, checksum) tuples or None, one per key (a client
        without that call: its locations converted here)."""
        if not keys:
            return []

        def fn(c: Any) -> list[Any]:
            fast = getattr(c, "get_many_tuples", None)
            if fast is not None:
                return fast(namespace, keys)
            return [as_location(loc) for loc in c.get_many(namespace, keys)]

        got = self._call("get", None, fn)
        return [None] * len(keys) if got is None else list(got)

    def post_get_many(self, namespace: str, keys: Sequence[bytes]) -> Any:
        """`get_many_tuples` sent now, answered by `take_get_many` later (the client's
        `post_get_many`): a ticket, or None when nothing was sent (the client cannot post, the
        server is down): ask with `get_many_tuples` then."""
        if not keys:
            return None

        def post(c: Any) -> Any:
            fn = getattr(c, "post_get_many", None)
            ticket = fn(namespace, keys) if fn is not None else None
            return None if ticket is None else (c, ticket)

        return self._call("get", None, post)

    def take_get_many(self, ticket: Any) -> list[Any] | None:
        """The answer to a posted lookup, as `get_many_tuples` answers; None when it cannot be had
        (the server went away, the ring broke): the blocks count as absent and any leases the
        answer held are lost with it, to expire on the server."""
        client, posted = ticket
        if client is not self._client:
            return None  # sent by a client this door has since dropped: its answer went with it
        return self._call("get", None, lambda c: c.take_get_many(posted))

    def reserve(self, namespace: str, key: bytes, nbytes: int) -> Any:
        """A Reservation, or None when the key is present already, the pool is full, or the server is down."""
        try:
            return self._call("reserve", None, lambda c: c.reserve(namespace, key, nbytes))
        except Exception as exc:  # noqa: BLE001
            name = type(exc).__name__
            self.stats.add(_skip_counter(name))
            return None

    def reserve_many(self, namespace: str, keys: Sequence[bytes], nbytes: int) -> list[Any]:
        """`reserve` for a request's blocks in one burst: a Reservation or None per key (present
        already, no space, or the server is down), skips counted as the single calls count them."""
        if not keys:
            return []
        try:
            got = self._call("reserve", None, lambda c: c.reserve_many(namespace, [(k, nbytes) for k in keys]))
        except Exception as exc:  # noqa: BLE001 - the whole request was refused: no block is saved
            self.stats.add(_skip_counter(type(exc).__name__), len(keys))
            return [None] * len(keys)
        if got is None:
            return [None] * len(keys)
        out: list[Any] = []
        for r in got:
            if isinstance(r, int):  # the protocol's Code that refused this key
                self.stats.add(_REFUSED.get(getattr(r, "name", ""), "save_skipped_refused"))
                out.append(None)
            else:
                out.append(r)
        return out

    def finish_many(self, commits: Sequence[tuple[Any, int | None]], aborts: Sequence[Any]) -> list[bool]:
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

    def writable(self, reservation: Any) -> bool:
        """May we still write into this reservation (deadline not passed, same epoch)? See fencing."""
        client = self._client
        try:
            return client is not None and bool(client.writable(reservation))
        except Exception:  # noqa: BLE001 - when in doubt, do not write
            return False

    def commit(self, token: Any, checksum: int | None = None) -> bool:
        """Make a saved block visible; `checksum`: the CRC32C of its bytes, which loads verify."""
        try:
            return bool(self._call("commit", False, lambda c: (c.commit(token, checksum=checksum), True)[1]))
        except Exception:  # noqa: BLE001 - an expired reservation only loses this block
            self.stats.add("commit_failed")
            return False

    def delete(self, namespace: str, key: bytes) -> None:
        """Drop a key (a block found corrupt), so later readers miss instead of reading it again."""
        with contextlib.suppress(Exception):  # best effort: at worst the next reader detects it too
            self._call("delete", None, lambda c: c.delete(namespace, key))

    def abort(self, token: Any) -> None:
        with contextlib.suppress(Exception):  # the server reclaims it after its timeout anyway
            self._call("abort", None, lambda c: c.abort(token))

    def release(self, lease_ids: Sequence[int], *, handed_over: bool = False) -> int | None:
        """How many of the leases were still live (None: unknown, the server did not answer).

        `handed_over`: the scheduler got these leases and passed them to this worker."""
        if not lease_ids:
            return 0
        try:
            return self._call("release", None, lambda c: c.release(list(lease_ids), handed_over=handed_over))
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return None

    def lease_trusted_until(self, asked: float) -> float | None:
        """Until when (time.monotonic) leases of a request sent after `asked` are certainly live
        (KVIndexClient.lease_trusted_until); None: not known (no client, or an older server)."""
        client = self._client
        trusted = getattr(client, "lease_trusted_until", None) if client is not None else None
        return trusted(asked) if trusted is not None else None

    def post_release(self, lease_ids: Sequence[int] | array, *, handed_over: bool = False) -> bool:
        """Release without waiting for the live count (KVIndexClient.post_release). True when sent,
        or when there is no server to tell (its leases then expire on their own); False when it
        could not be posted: release them with `release` instead. An array('Q') of ids (packed
        while they were warm) goes to the client as it is."""
        packed = isinstance(lease_ids, array)
        if not (len(lease_ids) if packed else any(lease_ids)):
            return True

        def post(c: Any) -> bool:
            fn = getattr(c, "post_release", None)
            return False if fn is None else bool(fn(lease_ids if packed else list(lease_ids), handed_over=handed_over))

        try:
            return self._call("release", True, post)
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return True

    def prepare_post_release(self, lease_ids: array, *, handed_over: bool = False) -> DoorRelease | None:
        """`post_release` in two halves (KVIndexClient.prepare_post_release): the release made ready
        now, posted by the caller's native call (the worker's `load_blocks_checked`, right after its
        copy), its result handed to `DoorRelease.done`. None when it cannot go that way (no server,
        no native helper, no room in flight): use `post_release` or `release` after the copy."""

        # Not through `_call`: this runs on every pool hit, and a connection that is down or not
        # yet made is left to the usual release after the copy (which retries it).
        client = self._client
        prepare = getattr(client, "prepare_post_release", None)
        if prepare is None:
            return None
        ended, refused = client.posted_leases_ended, client.posted_refused
        try:
            prepared = prepare(lease_ids, handed_over=handed_over)
        except Exception as exc:  # noqa: BLE001 - as `_call` takes it: the release after the copy retries
            self._release_post_failed(exc)
            return None
        finally:
            self._posted_said(client, ended, refused)  # earlier replies it took, when their room was needed
        if prepared is None:
            return None
        self.messages += prepared.messages  # booked as posted; `done` takes back what was not
        return DoorRelease(self, prepared)

    def _release_post_failed(self, exc: Exception) -> bool:
        """What `_call` and `post_release` make of an error, for a release a native call posted."""
        if type(exc).__name__ in _RAISED:
            self.stats.add("release_failed")
        else:
            self._failed("release", exc)
        return True

    def release_groups(self, groups: Sequence[Sequence[int]], *, handed_over: bool = False) -> list[int] | None:
        """`release` for several sets of leases in one burst: each set's live count (None: unknown)."""
        if not any(groups):
            return [0] * len(groups)
        try:
            return self._call(
                "release", None, lambda c: c.release_groups([list(g) for g in groups], handed_over=handed_over)
            )
        except Exception:  # noqa: BLE001 - a refused release leaves the leases to expire
            self.stats.add("release_failed")
            return None

    def removals_since(self, namespace: str, cursor: int, epoch: int) -> tuple[Any, bool] | None:
        """Keys of `namespace` the server removed from `cursor` on: (Removals, False), if `epoch`
        is still the server's. Otherwise (the first call with epoch 0, the server restarted since,
        or it refused the cursor): (a probe, True), whose `head` is where to follow from and whose
        `epoch` is the server's. None when the server is away."""

        def ask(client: Any) -> tuple[Any, bool]:
            if client.epoch == epoch:
                try:
                    return client.removals_since(cursor, namespace), False
                except Exception as exc:
                    if type(exc).__name__ != "RequestRejected":
                        raise
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
}


def _skip_counter(exc_name: str) -> str:
    return "save_skipped_exists" if exc_name == "AlreadyPresent" else "save_skipped_" + exc_name.lower()


def as_location(loc: Any) -> tuple[list[tuple[int, int]], int, int, int | None] | None:
    """A client's BlockLocation (or anything shaped like it) as the connector's Location tuple."""
    if loc is None:
        return None
    checksum = getattr(loc, "checksum", None)
    return (
        [(int(o), int(n)) for o, n in loc.extents],
        int(loc.lease_id),
        int(loc.nbytes),
        None if checksum is None else int(checksum),
    )


class DoorRelease:
    """A release `BestEffortIndex.prepare_post_release` made ready: `args` for the native call that
    posts it, `done` with that call's result. Kept to one frame and the client's `done` (two):
    it runs right after a copy, when every function touched first is a cache miss."""

    __slots__ = ("door", "prepared")

    def __init__(self, door: BestEffortIndex, prepared: Any) -> None:
        self.door = door
        self.prepared = prepared

    @property
    def args(self) -> tuple:
        return self.prepared.args

    def done(self, result: Any) -> bool:
        """True: posted, or refused by a server that will not hear it (the leases expire there);
        False: nothing was posted (the copy ended too late, or `result` None after the native call
        raised): release the usual way."""
        if result.__class__ is list:
            return True  # posted as booked (this runs right after the copy: touch nothing)
        door = self.door
        before = self.prepared.client.messages
        try:
            return self.prepared.done(result)
        except Exception as exc:  # noqa: BLE001 - a refused release leaves the leases to expire
            return door._release_post_failed(exc)
        finally:
            door.messages += self.prepared.client.messages - before
