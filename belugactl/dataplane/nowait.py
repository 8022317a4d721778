"""No-wait requests: sent now, their replies taken later.

A KVIndexClient request normally waits for its reply. Two callers cannot afford the wait:
- the vLLM scheduler starts a request's pool lookup when the request arrives and finishes it when
  it schedules the request (`start_lookup` / `finish_lookup`), so the server works meanwhile;
- the vLLM worker ends the leases of a pool hit's copy without waiting for the live count, when the
  copy ended while the leases were certainly live (`release_nowait`), or has its own native call
  send that release right after the copy (`release_with_copy`, which returns a `CopyRelease`).

Replies come back in the order the requests went out, so the client keeps one queue of what it
has yet to take (`KVIndexClient._pending_replies`): for each RELEASE message, the lease count its
reply should report; for each lookup, its PendingLookup. The queue is emptied, oldest first,
before the client's next ordinary request (`collect_replies`); a lookup's answer taken on the way
is kept for its `finish_lookup`. What the RELEASE replies said is counted on the client
(`nowait_leases_ended`, `nowait_refused`) and never read as a live count.

The functions here are the client's methods (client.py binds them by name): they use its private
helpers as methods would. Transports declare what they can do in one native call
(`ClientTransport.can_start_lookups`, `can_release_in_one_call`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.metadata_errors import StaleEpoch
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.dataplane.rpc.transport import FENCED, TransportError

if TYPE_CHECKING:
    from belugactl.dataplane.client import KVIndexClient, LocationTuple


@dataclass(eq=False)
class PendingLookup:
    """A GET_MANY lookup `start_lookup` sent, whose answer `finish_lookup` takes (or an earlier
    request's wait took and kept here: replies come back in the order they were sent)."""

    namespace: str
    keys: Sequence[bytes]
    seq: int
    per_call: int
    reply: tuple | None = None  # what the transport's finish_get_many returned
    error: Exception | None = None  # why no reply will come (the ring broke, the client reconnected)
    taken: bool = False
    owner: object = field(default=None, repr=False)  # the client that sent it: only it can take the answer


class CopyRelease:
    """A no-wait release made ready by `KVIndexClient.release_with_copy`: `args` go to the native
    call that sends it (the one-call load, `load_blocks_checked`), whose result goes to `done`."""

    __slots__ = ("args", "client", "messages")

    def __init__(self, client: KVIndexClient, args: tuple, messages: int) -> None:
        self.client = client
        self.args = args
        self.messages = messages  # booked as sent by release_with_copy

    def done(self, result: Any) -> bool:
        """True when the release went out (its replies are taken before the client's next request);
        False when nothing was sent (`result` None: the copy ended too late to trust its leases,
        or the native call raised before it): release them the usual way, which says how many were
        still live. Raises StaleEpoch (the pool's epoch moved: nothing sent) or
        MetadataUnavailable (a slot still busy from an abandoned request), as `release_nowait` does."""
        if result.__class__ is list:
            return True  # everything went out as booked: nothing to touch (this runs cold)
        return self._undo_unsent(result)

    def _undo_unsent(self, result: Any) -> bool:
        c = self.client
        fenced = result is not None and result[0] == FENCED
        sent = 0 if result is None or fenced else len(result[1])
        c.transport.unreserve(self.args[2], self.messages, sent)
        for _ in range(self.messages - sent):
            c._pending_replies.pop()
        c.messages -= self.messages - sent
        if result is None:
            return False
        if fenced:
            raise c._error(Code.STALE_EPOCH, Op.RELEASE)
        c.transport.broken = True
        raise c._unavailable("ring slot still busy from an abandoned request")


def _release_per_call(client: KVIndexClient) -> int:
    """Lease ids one RELEASE message carries at the transport's payload size (cached per size)."""
    t = client.transport
    per_call = client._release_cap.get(t.max_payload)
    if per_call is None:
        per_call = client._release_cap[t.max_payload] = max(1, p.release_capacity(t.max_payload))
    return per_call


def release_nowait(client: KVIndexClient, lease_ids: Sequence[int] | array, *, granted_elsewhere: bool = False) -> bool:
    """Send RELEASE for `lease_ids` without waiting for the reply: for a reader that needs no
    live count (its copy ended within `lease_trusted_until`, or the leases hold nothing it
    read). The replies are taken before this client's next request (or by `collect_replies`);
    leases they report ended count in `nowait_leases_ended`, refusals in `nowait_refused`.
    `lease_ids` may be an array('Q') packed earlier (the vLLM worker packs its load's leases
    before the copy, while they are in the CPU caches: after a large copy each first touch of a
    Python object is a cache miss).

    False when nothing was sent because the transport has no room in flight for it: release
    them the usual way. Raises as other requests do (server away, stale epoch)."""
    if isinstance(lease_ids, array):
        ids: Sequence[int] | array = lease_ids  # zeros are skipped where they are encoded
    else:
        ids = [i for i in lease_ids if i]
    if not ids:
        return True
    t = client.transport
    if client._pending_replies or client._stale or t.broken:
        client._before_call()  # takes earlier replies first
    per_call = _release_per_call(client)
    if t.pending + -(-len(ids) // per_call) > max(1, t.max_inflight):
        return False
    flags = p.RELEASE_GRANTED_ELSEWHERE if granted_elsewhere else 0
    if t.can_release_in_one_call:
        # Encoded and sent in one native call (CXL rings), the fence checked in it too: this runs
        # right after a copy, with nothing in the CPU caches.
        try:
            counts = t.release_nowait(client._epoch32, ids, flags, per_call)
        except TransportError as exc:
            raise client._unavailable(str(exc)) from None
        if counts == FENCED:
            raise client._error(Code.STALE_EPOCH, Op.RELEASE)
        if counts is not None:
            client._pending_replies.extend(counts)
            client.messages += len(counts)
            return True
    client._check_fence(Op.RELEASE)
    for count, payload in client._release_payloads([i for i in ids if i], granted_elsewhere):
        try:
            t.submit(Op.RELEASE, client._epoch32, payload)
        except TransportError as exc:
            raise client._unavailable(str(exc)) from None
        client._pending_replies.append(count)
        client.messages += 1
    return True


def release_with_copy(
    client: KVIndexClient, lease_ids: array, *, granted_elsewhere: bool = False
) -> CopyRelease | None:
    """`release_nowait` in two halves, for a caller whose own native call sends the release (the
    vLLM worker's one-call load, `load_blocks_checked`, right after its copy, with no Python in
    between): earlier replies taken, the room in flight checked and the native release's
    arguments made now, while everything is in the CPU caches. None when it cannot go that way (a
    transport without the one-call release, no native helper, no room in flight): use
    `release_nowait` or `release`.

    Until the native call's result went to `CopyRelease.done`, nothing else may use this client
    (the caller holds its lock across both)."""
    t = client.transport
    if client._stale or t.broken:
        client._before_call()
    if not t.can_release_in_one_call or not len(lease_ids):
        return None
    per_call = _release_per_call(client)
    ids = len(lease_ids) - lease_ids.count(0)  # the native call skips zeros
    if not ids:
        return None
    messages = -(-ids // per_call)
    if t.pending + messages > max(1, t.max_inflight) and client._pending_replies:
        # Earlier replies are taken only when their room is needed: otherwise the next ordinary
        # request takes them (a save's burst, on the worker's background thread).
        collect_replies(client)
    if t.pending + messages > max(1, t.max_inflight):
        return None
    flags = p.RELEASE_GRANTED_ELSEWHERE if granted_elsewhere else 0
    args = t.release_args(client._epoch32, lease_ids, flags, per_call, messages)
    if args is None:
        return None
    # Booked as sent now, while in the caches; `done` undoes it for what the native call did not send.
    counts = [per_call] * (ids // per_call) + ([ids % per_call] if ids % per_call else [])
    client._pending_replies.extend(counts)
    client.messages += messages
    return CopyRelease(client, args, messages)


def collect_replies(client: KVIndexClient, until: PendingLookup | None = None) -> None:
    """Take the replies of no-wait RELEASEs and lookups, oldest first (usually there already: the
    server answers a RELEASE at once), up to and including `until` (None: all). A lookup's answer
    is kept for its `finish_lookup`."""
    queue = client._pending_replies
    while queue:
        want = queue[0]
        if isinstance(want, PendingLookup):
            try:
                want.reply = client.transport.finish_get_many(
                    want.seq, len(want.keys), want.per_call, client._timeout_ns
                )
            except TransportError as exc:
                drop_replies(client, str(exc))
                raise client._unavailable(str(exc)) from None
            queue.popleft()
            if want is until:
                return
            continue
        try:
            code, _epoch, reply = client.transport.collect(client._timeout_ns)
        except TransportError as exc:
            drop_replies(client, str(exc))
            raise client._unavailable(str(exc)) from None
        queue.popleft()
        if code:
            client.nowait_refused += 1
            if code == Code.STALE_EPOCH:
                client._stale = True
            continue
        try:
            live = p.decode_u32(reply, "RELEASE reply")
        except p.ProtocolError:
            client.nowait_refused += 1
            continue
        client.nowait_leases_ended += max(0, want - live)


def drop_replies(client: KVIndexClient, why: str) -> None:
    """Forget every pending reply (it will never be taken); a lookup among them answers its
    `finish_lookup` with MetadataUnavailable."""
    for item in client._pending_replies:
        if isinstance(item, PendingLookup) and item.reply is None:
            item.error = client._unavailable(why)
    client._pending_replies.clear()


def start_lookup(client: KVIndexClient, namespace: str, keys: Sequence[bytes]) -> PendingLookup | None:
    """Send a `get_many_tuples` lookup of `keys` now and take its answer later (`finish_lookup`),
    so the server works while the caller does something else: the vLLM scheduler starts a
    request's lookup when the request arrives and finishes it when it schedules the request.

    None when this transport cannot (TCP, no native helper, the ring's in-flight slots taken,
    keys of several lengths): nothing was sent; ask with `get_many_tuples`. The leases of the
    answer start when the server reads the request, as `get_many_tuples`' do: count a deadline
    from before this call. Requests sent before the answer is taken take it first and keep it.
    Raises as other requests do (server away, stale epoch)."""
    t = client.transport
    if not t.can_start_lookups or not keys:
        return None
    if client._stale:
        raise StaleEpoch("the metadata server restarted", fix="drop leases and tokens, then call reconnect()")
    if t.broken or namespace not in client._ns:
        client._before_call()  # reconnects; or the OPEN_NS round trip below needs the ring to itself
    ns = client._ns_id(namespace)
    client._check_fence(Op.GET_MANY)
    shape = (client.transport.max_payload, len(keys[0]))
    per_call = client._get_many_cap.get(shape)
    if per_call is None:
        per_call = client._get_many_cap[shape] = p.get_many_capacity(*shape)
    try:
        seq = client.transport.start_get_many(client._epoch32, ns, keys, per_call)
    except TransportError as exc:
        drop_replies(client, str(exc))
        raise client._unavailable(str(exc)) from None
    if seq is None:
        return None
    pending = PendingLookup(namespace, keys, seq, per_call, owner=client)
    client._pending_replies.append(pending)
    client.messages += -(-len(keys) // per_call)
    return pending


def finish_lookup(client: KVIndexClient, pending: PendingLookup) -> list[LocationTuple | None]:
    """The answer to a lookup `start_lookup` sent: one LocationTuple (with its own lease) or None
    per key, as `get_many_tuples` answers (keys a reply could not carry are asked again here).
    Raises as `get_many_tuples` does; each answer can be taken once."""
    if pending.owner is not client:
        raise ValueError("this lookup was not started by this client")
    if pending.taken:
        raise ValueError("this lookup's answer was taken already")
    pending.taken = True
    client.round_trips += 1  # one wait for the whole burst, counted where it is taken
    if pending.reply is None and pending.error is None:
        collect_replies(client, until=pending)
    if pending.error is not None:
        raise pending.error
    out, left = client._get_many_answer(pending.reply)
    if left:
        again = client.get_many_tuples(pending.namespace, [pending.keys[j] for j in left])
        for j, loc in zip(left, again, strict=True):
            out[j] = loc
    return out
