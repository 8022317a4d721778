"""The pool in vLLM's KV events: BlockStored when a save commits, BlockRemoved when the server drops a key.

A KV-aware router (Dynamo, llm-d) follows vLLM's KV events (`--kv-events-config`, ZMQ publisher) to
know which instance holds which blocks. With Beluga an instance also "holds" what is in the pool,
in another medium (`medium`, "CXL" unless `kv_connector_extra_config.kv_events_medium` says
otherwise), so the connector publishes the pool's side of it through vLLM's own path:

- Workers see which keys their saves committed (`CommitObserver`, wrapped around the best-effort
  index the copy code uses: a key counts once the server answered OK to its commit). vLLM collects
  `get_kv_connector_kv_cache_events()` after each step from every worker, sums them
  (KVOutputAggregator) and hands them to the scheduler's `update_connector_output`.
- The scheduler publishes through `take_events()`, the only connector events vLLM 0.32 publishes.
  A block counts as stored once every rank that stores it committed its shard (one rank for MLA,
  all of them otherwise); the scheduler fills in what workers cannot know: the parent hash, the
  block's tokens, LoRA and extra keys, noted when it planned the save (`note_saves`).
- Removals come from the metadata server's removal log (the REMOVALS request): the scheduler asks
  for its namespace's removals since its cursor at most every `kv_events_poll_s` (1 s by default,
  sooner while it is behind) and publishes them as one BlockRemoved. Keys another instance of the
  same namespace stored are included: the pool is shared, so they were this instance's hits too.

Everything is bounded: notes of planned saves, stores waiting for ranks, requests per poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent, KVConnectorKVEvents

from vllm_beluga.stats import ConnectorStats

log = logging.getLogger("vllm.beluga")

DEFAULT_MEDIUM = "CXL"
DEFAULT_POLL_S = 1.0
MAX_NOTES = 65536  # planned saves remembered until their commit is reported
MAX_WAITING_STEPS = 256  # a store some rank never confirmed is forgotten after this many steps
MAX_POLL_CALLS = 8  # REMOVALS requests per poll; more next step while behind


def _external(key: bytes) -> Any:
    """The block hash as vLLM's own events carry it (bytes, or an int under
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), so the router matches pool and GPU events."""
    try:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        return maybe_convert_block_hash(key)
    except Exception:  # noqa: BLE001 - an older vLLM: bytes are what it published
        return key


class BelugaKVEvents(KVConnectorKVEvents):
    """What one step's workers committed, as BlockStored events carrying only the block's hash (the
    scheduler completes them). Falsy when empty, so vLLM drops an empty container."""

    def __init__(self, events: list[KVCacheEvent] | None = None, num_workers: int = 1) -> None:
        self.events: list[KVCacheEvent] = list(events or [])
        self.num_workers = num_workers

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self.events.extend(events)

    def aggregate(self) -> BelugaKVEvents:
        return self  # the scheduler counts ranks per key itself (SchedulerEvents.absorb)

    def increment_workers(self, count: int = 1) -> None:
        self.num_workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self.events)

    def get_number_of_workers(self) -> int:
        return self.num_workers

    def clear_events(self) -> None:
        self.events.clear()
        self.num_workers = 1

    def __bool__(self) -> bool:
        return bool(self.events)

    def __repr__(self) -> str:
        return f"<BelugaKVEvents {len(self.events)} events from {self.num_workers} workers>"


class CommitObserver:
    """The best-effort index (BestEffortIndex) as the copy code sees it, noting which keys committed.

    Reservations are matched to their keys (`reserve_many`) and commits to their reservations
    (`finish_many`, one OK per visible block); everything else passes straight through. Saves may
    run on a background thread while vLLM's step thread takes the committed keys: hence the lock.
    """

    def __init__(self, index: Any, enabled: bool = True) -> None:
        self._index = index
        self._enabled = enabled
        self._keys: dict[Any, bytes] = {}  # reservation token -> key, until committed or aborted
        self.committed: list[bytes] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    def reserve_many(self, namespace: str, keys: Sequence[bytes], nbytes: int) -> list[Any]:
        got = self._index.reserve_many(namespace, keys, nbytes)
        if not self._enabled:
            return got
        with self._lock:
            for key, r in zip(keys, got, strict=False):
                if r is not None and getattr(r, "token", None) is not None:
                    self._keys[r.token] = bytes(key)
            if len(self._keys) > MAX_NOTES:  # tokens whose commit never came (an exception in a copy)
                for token in list(self._keys)[: len(self._keys) - MAX_NOTES]:
                    del self._keys[token]
        return got

    def finish_many(self, commits: Sequence[tuple[Any, int]], aborts: Sequence[Any]) -> list[bool]:
        ok = self._index.finish_many(commits, aborts)
        if not self._enabled:
            return ok
        with self._lock:
            for (token, _crc), done in zip(commits, ok, strict=False):
                key = self._keys.pop(token, None)
                if done and key is not None:
                    self.committed.append(key)
            for token in aborts:
                self._keys.pop(token, None)
        return ok

    def take_committed(self) -> list[bytes]:
        with self._lock:
            out, self.committed = self.committed, []
        return out


@dataclass(frozen=True)
class _StoreNote:
    parent: bytes | None
    token_ids: tuple[int, ...]
    lora_id: int | None
    lora_name: str | None
    extra_keys: tuple[Any, ...] | None


def _lora(request: Any) -> tuple[int | None, str | None]:
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None, None
    return getattr(lora, "adapter_id", None), getattr(lora, "name", None)


def _extra_keys(request: Any, start: int, end: int) -> tuple[Any, ...] | None:
    try:
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys

        keys, _mm = generate_block_hash_extra_keys(request, start, end, 0)
        converted = to_event_extra_keys([keys])
        return converted[0] if converted else None
    except Exception:  # noqa: BLE001 - a request vLLM's helper cannot read: publish without them
        return None


class SchedulerEvents:
    """The scheduler's side: notes of planned saves, stores waiting for every rank, the removal cursor."""

    def __init__(
        self,
        *,
        index: Any,
        namespace: str,
        block_size: int,
        ranks: int,
        stats: ConnectorStats,
        medium: str = DEFAULT_MEDIUM,
        poll_s: float = DEFAULT_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.namespace = namespace
        self.block_size = block_size
        self.ranks = max(1, ranks)
        self.stats = stats
        self.medium = medium
        self.poll_s = poll_s
        self.clock = clock
        self._notes: OrderedDict[bytes, _StoreNote] = OrderedDict()
        self._confirmed: Counter[bytes] = Counter()
        self._waiting_since: dict[bytes, int] = {}
        self._ready: list[bytes] = []
        self._step = 0
        self._epoch = 0  # the server epoch `_cursor` belongs to (0: none yet)
        self._cursor = 0
        self._next_poll = 0.0

    # -- stores ---------------------------------------------------------------------------------
    def note_saves(
        self, saves: Iterable[Any], requests: dict[str, Any], block_keys: Callable[[Any], list[bytes]]
    ) -> None:
        """Remember, for each block a step plans to save, what its BlockStored must say."""
        bs = self.block_size
        for transfer in saves:
            state = requests.get(transfer.req_id)
            request = getattr(state, "request", None)
            if request is None:
                continue
            keys = block_keys(request)
            position = {k: i for i, k in enumerate(keys)}
            tokens = request.all_token_ids
            lora_id, lora_name = _lora(request)
            for key in transfer.keys:
                i = position.get(key)
                if i is None:
                    continue
                start, end = i * bs, (i + 1) * bs
                self._notes[key] = _StoreNote(
                    keys[i - 1] if i else None,
                    tuple(tokens[start:end]),
                    lora_id,
                    lora_name,
                    _extra_keys(request, start, end),
                )
                self._notes.move_to_end(key)
        while len(self._notes) > MAX_NOTES:
            self._notes.popitem(last=False)

    def absorb(self, events: Any) -> None:
        """Workers' committed keys of one step (vLLM's aggregated `kv_cache_events`)."""
        if not isinstance(events, BelugaKVEvents):
            return
        for event in events.get_all_events():
            if not isinstance(event, BlockStored):
                continue
            for h in event.block_hashes:
                key = bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else None
                if key is None:
                    continue
                self._confirmed[key] += 1
                self._waiting_since.setdefault(key, self._step)
                if self._confirmed[key] >= self.ranks:
                    del self._confirmed[key], self._waiting_since[key]
                    self._ready.append(key)

    def _stored_events(self) -> list[KVCacheEvent]:
        ready, self._ready = self._ready, []
        out: list[BlockStored] = []
        last: bytes | None = None
        for key in ready:
            note = self._notes.pop(key, None)
            if note is None:
                continue  # planned too long ago to remember: say nothing rather than something wrong
            prev = out[-1] if out else None
            if (
                prev is not None
                and last is not None
                and note.parent == last
                and (prev.lora_id, prev.lora_name) == (note.lora_id, note.lora_name)
            ):
                # The next block of the same chain: one event, as vLLM's own BlockStored groups them.
                prev.block_hashes.append(_external(key))
                prev.token_ids.extend(note.token_ids)
                if prev.extra_keys is not None or note.extra_keys is not None:
                    prev.extra_keys = [*(prev.extra_keys or [None] * (len(prev.block_hashes) - 1)), note.extra_keys]
            else:
                out.append(
                    BlockStored(
                        block_hashes=[_external(key)],
                        parent_block_hash=None if note.parent is None else _external(note.parent),
                        token_ids=list(note.token_ids),
                        block_size=self.block_size,
                        lora_id=note.lora_id,
                        medium=self.medium,
                        lora_name=note.lora_name,
                        extra_keys=None if note.extra_keys is None else [note.extra_keys],
                        group_idx=0,
                    )
                )
            last = key
        if out:
            self.stats.add("kv_events_stored", sum(len(e.block_hashes) for e in out))
        return list(out)

    def _forget_unconfirmed(self) -> None:
        """A rank that never reports a key (its save was skipped: pool full, fenced) must not keep
        the others' confirmations forever."""
        cutoff = self._step - MAX_WAITING_STEPS
        stale = [k for k, since in self._waiting_since.items() if since < cutoff]
        for key in stale:
            del self._confirmed[key], self._waiting_since[key]
            self._notes.pop(key, None)

    # -- removals -------------------------------------------------------------------------------
    def _removed_events(self) -> list[KVCacheEvent]:
        now = self.clock()
        if now < self._next_poll:
            return []
        removed: list[bytes] = []
        behind = False
        for _ in range(MAX_POLL_CALLS):
            answer = self.index.removals_since(self.namespace, self._cursor, self._epoch)
            if answer is None:
                break  # the server is away (the index reconnects later): try at the next poll
            got, head_query = answer
            if head_query:
                # First poll, or the server restarted (a new epoch, a new log): follow from its present.
                if self._epoch and got.epoch != self._epoch:
                    self.stats.add("removal_epoch_changes")
                self._epoch, self._cursor = got.epoch, got.head
                continue
            if got.lost:
                log.warning("Beluga: %d pool removals were dropped from the server's log before we read them", got.lost)
                self.stats.add("removals_lost", got.lost)
            removed.extend(r.key for r in got.items)
            self._cursor = got.next_cursor
            if got.caught_up:
                break
        else:
            behind = True
        self._next_poll = now if behind else now + self.poll_s
        if not removed:
            return []
        for key in removed:
            self._notes.pop(key, None)
        self.stats.add("kv_events_removed", len(removed))
        return [BlockRemoved(block_hashes=[_external(k) for k in removed], medium=self.medium)]

    def take(self) -> list[KVCacheEvent]:
        """This step's events: stores every rank confirmed, then what the server removed."""
        self._step += 1
        if self._waiting_since and self._step % 64 == 0:
            self._forget_unconfirmed()
        return self._stored_events() + self._removed_events()


def worker_events(observer: CommitObserver, block_size: int, medium: str) -> BelugaKVEvents | None:
    """The keys this worker committed since the last step, for `get_kv_connector_kv_cache_events`."""
    keys = observer.take_committed()
    if not keys:
        return None
    return BelugaKVEvents(
        [
            BlockStored(
                block_hashes=[k],
                parent_block_hash=None,
                token_ids=[],
                block_size=block_size,
                lora_id=None,
                medium=medium,
                lora_name=None,
            )
            for k in keys
        ]
    )


def events_enabled(vllm_config: Any) -> bool:
    config = getattr(vllm_config, "kv_events_config", None)
    return bool(config is not None and getattr(config, "enable_kv_cache_events", False))
