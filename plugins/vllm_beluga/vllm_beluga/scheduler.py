"""The connector's scheduler side (one per engine): which prompt blocks the pool has, and what to save.

For a new request, ask the server how many leading full blocks of its block-hash chain are in the
pool and offer that many tokens (never the prompt's last token, which vLLM must compute to sample).
It reserves nothing: after vLLM allocated blocks it records which block ids to fill from which keys,
and which freshly computed prompt blocks to save, in the step's `BelugaConnectorMetadata`.

Keys are vLLM's own block hashes (reproducible fleet-wide with a pinned PYTHONHASHSEED and
`--prefix-caching-hash-algo sha256_cbor`, both checked at start), in a namespace of model, layout
and tensor-parallel rank.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.rpc.protocol import LocationTuple
from vllm_beluga.context import ConnectorContext
from vllm_beluga.kv_events import DEFAULT_POLL_S, SchedulerEvents
from vllm_beluga.metadata import BelugaConnectorMetadata, BlockTransfer
from vllm_beluga.transfer import locate_many, monotonic_clock_id

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger("vllm.beluga")

# A request's lookup is started when it arrives (on_new_request) and its answer taken when vLLM
# first schedules it, if that comes within this long; later the answer is dropped (its leases
# released) and the lookup asked again, so a request that waited in the queue sees what the pool
# has now.
LOOKUP_FRESH_S = 0.5

# A hit between lookup and allocation: (first block to load, its keys, their locations (None: the
# workers look them up), the leases of this lookup that no block to load holds, until when the
# leases are certainly live (None: unknown)).
PendingHit = tuple[int, list[bytes], list[LocationTuple | None] | None, list[int], float | None]


@dataclass
class _EarlyLookup:
    started: Any  # BestEffortIndex.start_lookup's
    keys: list[bytes]
    asked: float  # time.monotonic() before it was sent: where its leases' deadline counts from


@dataclass
class _RequestState:
    request: Any
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int | None = None  # blocks below this index are in the pool or not ours to save
    save: bool = True
    known_present: int = 0  # leading full blocks the lookup found in the pool: never saved again
    saving: bool = False  # a save was planned: at finish the workers keep its blocks until it completed


def request_switches(request: Any) -> dict[str, Any]:
    """The request's own switches (OpenAI `kv_transfer_params`): `{"beluga": {"load": false,
    "save": false}}` turns the connector off for that request, e.g. to compare against a recompute."""
    params = getattr(request, "kv_transfer_params", None) or {}
    beluga = params.get("beluga") if isinstance(params, dict) else None
    return beluga if isinstance(beluga, dict) else {}


def _lease_ids(locations: Iterable[LocationTuple | None]) -> list[int]:
    """The read leases held by these locations (None: a block not found, no lease)."""
    return [loc[1] for loc in locations if loc is not None]


class BelugaScheduler:
    def __init__(self, ctx: ConnectorContext) -> None:
        self.ctx = ctx
        self.index = ctx.index
        self.stats = ctx.stats
        self.namespace = ctx.namespace
        self.block_size = ctx.block_size
        self.index.connect_now()
        self._requests: dict[str, _RequestState] = {}
        self._pending_hits: dict[str, PendingHit] = {}
        self._early_lookups: dict[str, _EarlyLookup] = {}
        # Start each request's lookup when it arrives (one rank: the GET_MANY the scheduler asks
        # anyway), so the metadata server wakes and answers while the engine does its own work
        # before it schedules the request; {"post_lookups": false} asks at scheduling instead.
        self.lookup_on_arrival = ctx.tp_size == 1 and ctx.cfg.extra.get("post_lookups", True) is not False
        # Lookup leases whose job is done (the blocks were located with leases of their own, or will
        # not be loaded): released in one burst per step, not left to pin blocks for the lease TTL.
        self._done_leases: list[int] = []
        self._loads: list[BlockTransfer] = []
        self._hash_ratio: int | None = None
        self._trips_reported = 0
        self._events: SchedulerEvents | None = None
        if ctx.events_on:
            self._events = SchedulerEvents(
                index=self.index,
                namespace=self.namespace,
                block_size=self.block_size,
                ranks=1 if ctx.mla else ctx.tp_size,  # who stores each block (MLA: rank 0 only)
                stats=self.stats,
                medium=ctx.medium,
                poll_s=float(ctx.cfg.extra.get("kv_events_poll_s", DEFAULT_POLL_S)),
            )

    def block_keys(self, request: Any) -> list[bytes]:
        """One key per full block: vLLM's chained hash of the block (the last sub-block hash when vLLM
        hashes at a finer granularity than the block size)."""
        hashes = list(request.block_hashes)
        if self._hash_ratio is None:
            full_blocks = request.num_tokens // self.block_size
            self._hash_ratio = max(1, len(hashes) // full_blocks) if full_blocks else None
        ratio = self._hash_ratio or 1
        return [bytes(h) for h in hashes[ratio - 1 :: ratio]]

    def on_new_request(self, request: Request) -> None:
        self._requests.setdefault(request.request_id, _RequestState(request=request, save=self.ctx.saves_enabled))
        if self.lookup_on_arrival and request_switches(request).get("load", True) is not False:
            self._start_lookup(request)

    def _start_lookup(self, request: Request) -> None:
        """Send the request's lookup now (every full block, as get_num_new_matched_tokens asks);
        its answer is taken when vLLM schedules the request."""
        if (request.num_tokens - 1) // self.block_size < 1:
            return  # nothing could be offered
        every = self.block_keys(request)
        started, asked = time.perf_counter(), time.monotonic()
        sent = self.index.start_lookup(self.namespace, every)
        self.stats.add("lookup_post_us", int((time.perf_counter() - started) * 1e6))
        if sent is not None:
            self._early_lookups[request.request_id] = _EarlyLookup(sent, every, asked)
            self.stats.add("lookups_posted")

    def _drop_early_lookup(self, early: _EarlyLookup | None) -> None:
        """A lookup started on arrival that no one will use: take its answer and release its leases."""
        if early is None:
            return
        started = time.perf_counter()
        got = self.index.finish_lookup(early.started)
        self._done_leases += _lease_ids(got or ())
        self.stats.add("lookup_dropped_us", int((time.perf_counter() - started) * 1e6))
        self.stats.add("lookups_posted_dropped")

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._requests.setdefault(request.request_id, _RequestState(request=request))
        switches = request_switches(request)
        state.save = self.ctx.saves_enabled and switches.get("save", True) is not False
        self._drop_pending_hit(request.request_id)  # looked up again: vLLM could not schedule it last time
        early = self._early_lookups.pop(request.request_id, None)
        if switches.get("load", True) is False:
            self._drop_early_lookup(early)
            return 0, False
        # The last token is never offered: vLLM must compute at least one token to sample from.
        loadable = (request.num_tokens - 1) // self.block_size
        every = self.block_keys(request)
        keys = every[:loadable]
        start = num_computed_tokens // self.block_size
        if len(keys) <= start:
            self._drop_early_lookup(early)
            return 0, False
        if early is not None and (early.keys != every or time.monotonic() - early.asked > LOOKUP_FRESH_S):
            self._drop_early_lookup(early)  # stale, or asked about other blocks
            early = None
        started, trips = time.perf_counter(), self.index.round_trips
        asked = time.monotonic()
        # Every full block is asked about, the one holding the last token too (never offered): when
        # it is present as well, this request's save skips it instead of meeting "already there".
        if early is not None:
            found, located, spare = self._finish_early_lookup(early, every)
            asked = early.asked
        else:
            found, located, spare = self._lookup(every)
        present = min(found, loadable)
        state.known_present = found
        self.stats.add("lookups")
        self.stats.add("lookup_us", int((time.perf_counter() - started) * 1e6))
        self.stats.add("lookup_metadata_round_trips", self.index.round_trips - trips)
        self.stats.add("lookup_blocks", len(every))
        if located is not None:
            # Only the blocks to load keep their leases; the worker releases the others with its own.
            spare += [loc[1] for i, loc in enumerate(located) if loc is not None and not start <= i < present]
            located = located[start:present]
        if present <= start:
            self._done_leases.extend(spare)
            return 0, False
        self.stats.add("hit_blocks", present - start)
        self.stats.add("hit_requests")
        trusted = self.index.lease_trusted_until(asked) if located is not None else None
        self._pending_hits[request.request_id] = (start, keys[start:present], located, spare, trusted)
        log.info(
            "Beluga: request %s: %d of %d full blocks in the pool, %d to load",
            request.request_id,
            present,
            len(keys),
            present - start,
        )
        return present * self.block_size - num_computed_tokens, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        pending = self._pending_hits.pop(request.request_id, None)
        if pending is None:
            return
        start, keys, located, spare, trusted = pending
        if num_external_tokens <= 0:
            self._done_leases += spare + _lease_ids(located or ())
            return
        count = num_external_tokens // self.block_size
        block_ids = list(blocks.get_block_ids()[0])[start : start + count]
        keys = keys[: len(block_ids)]
        locations = None
        if located is not None:
            locations = located[: len(block_ids)]
            spare = spare + _lease_ids(located[len(block_ids) :])
        else:
            # Each rank looks its own shard up (its own namespace); this lookup's leases are done.
            self._done_leases += spare
            spare = []
        # Blocks without a key or a location are loaded by no one: the worker reports them as load errors.
        clock = monotonic_clock_id() if trusted is not None else ""
        self._loads.append(BlockTransfer(request.request_id, block_ids, keys, locations, spare, trusted, clock))

    def _lookup(self, keys: list[bytes]) -> tuple[int, list[LocationTuple | None] | None, list[int]]:
        """How many leading `keys` the pool has; where they are (with a read lease each), when this
        process can say (None: each worker looks its shard up); and leases this lookup took that
        hold no located block.

        With one rank the scheduler's namespace is the worker's: one GET_MANY burst answers both
        "how many" and "where", so a hit costs the scheduler one round trip, not a lookup and then a
        locate. The leases keep the blocks from eviction until the worker copied them. With several
        ranks: a LOOKUP_PREFIX here (its leases released after allocation), the locations found by
        each rank, under its own leases. Each rank holds its own shard under its own namespace; with
        MLA every rank copies the one copy, and one set of leases passed to all of them would be
        released by the first to finish while the others still read."""
        if self.ctx.tp_size == 1:
            located = locate_many(self.index, self.namespace, keys)
            found = next((i for i, loc in enumerate(located) if loc is None), len(located))
            return found, located, []
        found, leases = self.index.lookup_prefix_leased(self.namespace, keys)
        return found, None, leases

    def _finish_early_lookup(
        self, early: _EarlyLookup, keys: list[bytes]
    ) -> tuple[int, list[LocationTuple | None] | None, list[int]]:
        """`_lookup`'s answer from the lookup started when the request arrived (one rank only)."""
        located = self.index.finish_lookup(early.started)
        if located is None:  # the server went away meanwhile: a miss, as a lookup would say
            located = [None] * len(keys)
        else:
            self.stats.add("lookups_posted_used")
        found = next((i for i, loc in enumerate(located) if loc is None), len(located))
        return found, located, []

    def _drop_pending_hit(self, req_id: str) -> None:
        pending = self._pending_hits.pop(req_id, None)
        if pending is not None:
            _start, _keys, located, spare, _trusted = pending
            self._done_leases += spare + _lease_ids(located or ())

    def _release_done_leases(self) -> None:
        """Release the lookup leases no longer needed, in one pipelined burst (none: no round trip)."""
        if not self._done_leases:
            return
        leases, self._done_leases = self._done_leases, []
        started, trips = time.perf_counter(), self.index.round_trips
        # Nothing was read under these: no live count to wait for.
        if not self.index.release_nowait(leases):
            self.index.release(leases)
        self.stats.add("lookup_release_us", int((time.perf_counter() - started) * 1e6))
        self.stats.add("lookup_release_round_trips", self.index.round_trips - trips)
        self.stats.add("lookup_leases_released", len(leases))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> BelugaConnectorMetadata:
        self._release_done_leases()
        meta = BelugaConnectorMetadata(loads=self._loads)
        self._loads = []
        meta.preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        for new_req in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue
            state.block_ids = list(new_req.block_ids[0])
            if state.saved_upto is None:
                # Blocks computed before this step (vLLM's prefix cache) or loaded from the pool are not
                # saved, nor blocks the lookup found in the pool already.
                state.saved_upto = max(new_req.num_computed_tokens // self.block_size, state.known_present)
            self._plan_save(meta, new_req.req_id, state, new_req.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                state.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                state.block_ids.extend(new_ids[0])
            if state.saved_upto is None:
                state.saved_upto = max(cached.num_computed_tokens[i] // self.block_size, state.known_present)
            self._plan_save(meta, req_id, state, cached.num_computed_tokens[i], scheduler_output)
        if self._events is not None and meta.saves:
            self._events.note_saves(meta.saves, self._requests, self.block_keys)
        return meta

    def _plan_save(
        self, meta: BelugaConnectorMetadata, req_id: str, state: _RequestState, computed: int, out: SchedulerOutput
    ) -> None:
        request = state.request
        scheduled = out.num_scheduled_tokens.get(req_id, 0)
        # Only prompt blocks: they are what another request can share.
        done = min(computed + scheduled, request.num_prompt_tokens) // self.block_size
        start = state.saved_upto or 0
        if done <= start:
            return
        state.saved_upto = done
        if not state.save:
            return
        keys = self.block_keys(request)
        end = min(done, len(keys), len(state.block_ids))
        if end > start:
            meta.saves.append(BlockTransfer(req_id, state.block_ids[start:end], keys[start:end]))
            state.saving = True

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # With asynchronous saves a request we planned a save for keeps its blocks until every worker
        # reported its saves complete (get_finished); the others are freed now.
        state = self._requests.pop(request.request_id, None)
        self._drop_pending_hit(request.request_id)
        self._drop_early_lookup(self._early_lookups.pop(request.request_id, None))
        return bool(state is not None and state.saving and self.ctx.async_saves), None

    # -- vLLM's KV events and metrics (kv_events.py, vllm_metrics.py) ----------------------------
    def absorb_events(self, kv_cache_events: Any) -> None:
        """The workers' committed keys, summed by vLLM (update_connector_output)."""
        if self._events is not None:
            self._events.absorb(kv_cache_events)

    def take_events(self) -> Iterable[KVCacheEvent]:
        if self._events is None:
            return ()
        return self._events.take()

    def take_round_trips(self) -> int:
        """The scheduler's round trips (lookups, block locations, removal polls) since the last call."""
        trips = self.index.round_trips
        new, self._trips_reported = trips - self._trips_reported, trips
        return new

    def shutdown(self) -> None:
        self.stats.flush()
        self.index.close()
