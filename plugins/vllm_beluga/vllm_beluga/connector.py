"""BelugaConnector: vLLM KV blocks in a shared CXL pool, indexed by belugactl's metadata server.

Scheduler side (one per engine): for a new request, ask the server how many leading full blocks of
its block-hash chain are in the pool and offer that many tokens (never the prompt's last token, which
vLLM must compute to sample). It reserves nothing: after vLLM allocated blocks it records which
block ids to fill from which keys, and which freshly computed prompt blocks to save.

Worker side (one per tensor-parallel rank): before the forward pass, look each key up (a read
lease), copy its extents into the paged KV tensors and release the lease; blocks that cannot be
loaded are reported through `get_block_ids_with_load_errors` (vLLM recomputes them with
`kv_load_failure_policy: recompute`). After the forward pass, reserve extents for a request's new
full blocks in one burst, copy all their layers' pieces there in one batch, and commit them in one
burst: a block is visible to other instances only after its bytes are in the pool.

Keys are vLLM's own block hashes (reproducible fleet-wide with a pinned PYTHONHASHSEED and
`--prefix-caching-hash-algo sha256_cbor`, both checked at start), in a namespace of model, layout
and tensor-parallel rank.

Per-request switch (OpenAI `kv_transfer_params`): `{"beluga": {"load": false, "save": false}}`
turns the connector off for that request, e.g. to compare against a recompute.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vllm_beluga.config import (
    BelugaConfig,
    check_hash_pins,
    layerwise_loads_for,
    layout_id,
    namespace_for,
    refuse_hybrid,
)
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.kv_events import (
    DEFAULT_MEDIUM,
    DEFAULT_POLL_S,
    BelugaKVEvents,
    CommitObserver,
    SchedulerEvents,
    events_enabled,
    worker_events,
)
from vllm_beluga.overlap import AsyncSaves, LayerwiseLoad, run_layerwise
from vllm_beluga.prefault import PoolPrefault
from vllm_beluga.stats import ConnectorStats
from vllm_beluga.transfer import Location, PoolTransfer, locate_many, monotonic_clock_id
from vllm_beluga.vllm_metrics import BelugaKVConnectorStats, BelugaPromMetrics

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# A child of vLLM's logger, so our lines land in vLLM's log with its format and level.
log = logging.getLogger("vllm.beluga")


def _lease_ids(locations: Iterable[Location | None]) -> list[int]:
    """The read leases held by these locations (None: a block not found, no lease)."""
    return [loc[1] for loc in locations if loc is not None]


@dataclass
class BlockTransfer:
    req_id: str
    block_ids: list[int]
    keys: list[bytes]
    # Loads: where each key's bytes are (extents, lease id, nbytes), looked up by the scheduler over its
    # CXL-RPC ring right after allocation, the lease holding the block until the worker copied it;
    # None for a key that vanished (reported as a load error). None for the whole list: worker looks up.
    locations: list[Location | None] | None = None
    # The scheduler's leases on blocks this load does not copy: the worker hands them back in the
    # same burst as the load's own (no round trip of the scheduler's for them).
    spare_leases: list[int] = field(default_factory=list)
    # Until when (time.monotonic on the clock `clock` names) the scheduler's leases are certainly
    # live: a worker reading the same clock that copied within it posts its release (no wait).
    leases_trusted_until: float | None = None
    clock: str = ""

    def load_args(self) -> tuple[Any, ...]:
        """PoolTransfer.load's (and prepare_load's) arguments for this transfer, in order."""
        return (self.block_ids, self.keys, self.locations, self.spare_leases, self.leases_trusted_until, self.clock)


# A hit between lookup and allocation: (first block to load, its keys, their locations (None: the
# workers look them up), the leases of this lookup that no block to load holds, until when the
# leases are certainly live (None: unknown)).
_PendingHit = tuple[int, list[bytes], list[Location | None] | None, list[int], float | None]


# A request's lookup is posted when it arrives (on_new_request) and its answer taken when vLLM first
# schedules it, if that comes within this long; later the answer is dropped (its leases handed back)
# and the lookup asked again, so a request that waited in the queue sees what the pool has now.
POSTED_LOOKUP_FRESH_S = 0.5


@dataclass
class _PostedLookup:
    ticket: Any  # BestEffortIndex.post_get_many's
    keys: list[bytes]
    asked: float  # time.monotonic() before it was sent: where its leases' deadline counts from


@dataclass
class BelugaConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    # Requests vLLM preempted this step: their blocks may be handed out again before the forward
    # pass, so their asynchronous saves must finish first (handle_preemptions).
    preempted: set[str] = field(default_factory=set)


@dataclass
class _RequestState:
    request: Any
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int | None = None  # blocks below this index are in the pool or not ours to save
    save: bool = True
    known_present: int = 0  # leading full blocks the lookup found in the pool: never saved again
    saving: bool = False  # a save was planned: at finish the workers keep its blocks until it completed


def _request_switches(request: Any) -> dict[str, Any]:
    params = getattr(request, "kv_transfer_params", None) or {}
    beluga = params.get("beluga") if isinstance(params, dict) else None
    return beluga if isinstance(beluga, dict) else {}


def layout_facts(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None, cfg: BelugaConfig) -> dict[str, Any]:
    """Everything that decides a block's bytes, computed identically by the scheduler and the workers."""
    from vllm.platforms import current_platform

    model_config = vllm_config.model_config
    load_config = vllm_config.load_config
    load_format = str(getattr(load_config, "load_format", ""))
    groups: list[Any] = []
    if kv_cache_config is not None:
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            groups.append(
                [
                    type(spec).__name__,
                    getattr(spec, "block_size", None),
                    getattr(spec, "page_size_bytes", None),
                    len(group.layer_names),
                ]
            )
    facts: dict[str, Any] = {
        "model": cfg.model_id or model_config.model,
        "dtype": str(model_config.dtype),
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "block_size": vllm_config.cache_config.block_size,
        "platform": current_platform.device_type,
        "tp": vllm_config.parallel_config.tensor_parallel_size,
        "groups": groups,
        "load_format": load_format,
    }
    if "dummy" in load_format:
        # Random weights are only the same on two instances with the same seed.
        facts["seed"] = model_config.seed
    return facts


class BelugaConnector(KVConnectorBase_V1):
    """Not `SupportsHMA`, on purpose: blocks are keyed and copied for one KV-cache group. Without
    that marker vLLM turns its hybrid allocator off, so a sliding-window model runs with every layer
    in one full-attention group (correct, at a memory cost, as with LMCache); a model that needs the
    hybrid allocator (Mamba/SSM layers) is refused by vLLM at start, and by the check below if a
    configuration forces several groups through anyway."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        refuse_hybrid(kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.cfg = BelugaConfig.from_extra(extra)
        check_hash_pins(self.cfg, algo_in_use=str(vllm_config.cache_config.prefix_caching_hash_algo))
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            log.warning(
                "Beluga: kv_load_failure_policy is %r; with 'recompute' a block that fails to load is recomputed "
                "instead of failing the request",
                self._kv_transfer_config.kv_load_failure_policy,
            )
        self.block_size = vllm_config.cache_config.block_size
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        # MLA: the latent KV is the same on every tensor-parallel rank, so the pool holds one copy
        # (rank 0 saves it, every rank loads it, all under one namespace) instead of tp_size copies.
        self.mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        self.layout_id = layout_id(layout_facts(vllm_config, kv_cache_config, self.cfg))
        role_name = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            try:
                self.tp_rank = get_tensor_model_parallel_rank()
            except Exception:  # noqa: BLE001 - not initialised in some single-process setups
                self.tp_rank = 0
            role_name = f"worker{self.tp_rank}"
        else:
            self.tp_rank = 0  # the scheduler asks about rank 0's blocks; other ranks report misses as load errors
        self.namespace = namespace_for(
            self.cfg.namespace, self.layout_id, 0 if self.mla else self.tp_rank, 1 if self.mla else self.tp_size
        )
        self.stats = ConnectorStats(self.cfg.stats_path, role=role_name)
        self.stats.set("namespace", self.namespace)
        self.index = BestEffortIndex(
            # each process its own client: the scheduler's ring, or this tensor-parallel rank's
            self.cfg.address_for("scheduler" if role == KVConnectorRole.SCHEDULER else "worker", self.tp_rank),
            stats=self.stats,
            timeout_s=self.cfg.timeout_s,
            retry_s=self.cfg.retry_s,
        )
        log.info("Beluga connector (%s): namespace %s, server %s", role_name, self.namespace, self.index.address)
        if role == KVConnectorRole.SCHEDULER:
            self.index.warm_up()
        # scheduler state
        self._requests: dict[str, _RequestState] = {}
        self._pending_hits: dict[str, _PendingHit] = {}
        self._posted_lookups: dict[str, _PostedLookup] = {}
        # Post each request's lookup when it arrives (one rank: the GET_MANY the scheduler asks
        # anyway), so the metadata server wakes and answers while the engine does its own work
        # before it schedules the request; {"post_lookups": false} asks at scheduling instead.
        self.post_lookups = self.tp_size == 1 and self.cfg.extra.get("post_lookups", True) is not False
        # Lookup leases whose job is done (the blocks were located with leases of their own, or will
        # not be loaded): released in one burst per step, not left to pin blocks for the lease TTL.
        self._done_leases: list[int] = []
        self._loads: list[BlockTransfer] = []
        self._hash_ratio: int | None = None
        # worker state
        self._engine: Any = None
        self._pool: Any = None
        self._prefault: PoolPrefault | None = None
        self._load_errors: set[int] = set()
        self._init_observability(vllm_config, role)
        self._transfer = PoolTransfer(self._commits, None, self.namespace, self.stats)
        # Overlap (overlap.py): both on unless kv_connector_extra_config turns them off, which
        # serve's benchmarks do to measure what they save. Scheduler and workers read the same config.
        self.async_saves = self.cfg.extra.get("async_saves", True) is not False
        # Prefill/decode roles (vLLM's kv_role): a consumer loads and never saves (what it computes is
        # the decode); a producer saves synchronously, so its answer to the front door means "the
        # prompt's KV is in the pool" and the consumer asked next finds every block. A producer still
        # loads a prefix the pool already has: that is recompute saved, not a role broken.
        self.kv_role = str(getattr(self._kv_transfer_config, "kv_role", "kv_both") or "kv_both")
        self.saves_enabled = self.kv_role != "kv_consumer"
        if self.kv_role == "kv_producer":
            self.async_saves = False
        # Decided once the KV tensors and the copy engine are known (register_kv_caches): "auto"
        # depends on the tensors' device, and only an engine with `layer_plan` copies by layer.
        self.layerwise_loads = False
        self._layer_load: LayerwiseLoad | None = None
        self._load_thread: ThreadPoolExecutor | None = None
        self._saves: AsyncSaves | None = None

    # ------------------------------------------------------------------ scheduler side
    def _block_keys(self, request: Any) -> list[bytes]:
        """One key per full block: vLLM's chained hash of the block (the last sub-block hash when vLLM
        hashes at a finer granularity than the block size)."""
        hashes = list(request.block_hashes)
        if self._hash_ratio is None:
            full_blocks = request.num_tokens // self.block_size
            self._hash_ratio = max(1, len(hashes) // full_blocks) if full_blocks else None
        ratio = self._hash_ratio or 1
        return [bytes(h) for h in hashes[ratio - 1 :: ratio]]

    def on_new_request(self, request: Request) -> None:
        self._requests.setdefault(request.request_id, _RequestState(request=request, save=self.saves_enabled))
        if self.post_lookups and _request_switches(request).get("load", True) is not False:
            self._post_lookup(request)

    def _post_lookup(self, request: Request) -> None:
        """Send the request's lookup now (every full block, as get_num_new_matched_tokens asks);
        its answer is taken when vLLM schedules the request."""
        if (request.num_tokens - 1) // self.block_size < 1:
            return  # nothing could be offered
        every = self._block_keys(request)
        started, asked = time.perf_counter(), time.monotonic()
        ticket = self.index.post_get_many(self.namespace, every)
        self.stats.add("lookup_post_us", int((time.perf_counter() - started) * 1e6))
        if ticket is not None:
            self._posted_lookups[request.request_id] = _PostedLookup(ticket, every, asked)
            self.stats.add("lookups_posted")

    def _drop_posted_lookup(self, posted: _PostedLookup | None) -> None:
        """A posted lookup no one will use: take its answer and hand its leases back."""
        if posted is None:
            return
        started = time.perf_counter()
        got = self.index.take_get_many(posted.ticket)
        self._done_leases += _lease_ids(got or ())
        self.stats.add("lookup_dropped_us", int((time.perf_counter() - started) * 1e6))
        self.stats.add("lookups_posted_dropped")

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._requests.setdefault(request.request_id, _RequestState(request=request))
        switches = _request_switches(request)
        state.save = self.saves_enabled and switches.get("save", True) is not False
        self._drop_pending_hit(request.request_id)  # looked up again: vLLM could not schedule it last time
        posted = self._posted_lookups.pop(request.request_id, None)
        if switches.get("load", True) is False:
            self._drop_posted_lookup(posted)
            return 0, False
        # The last token is never offered: vLLM must compute at least one token to sample from.
        loadable = (request.num_tokens - 1) // self.block_size
        every = self._block_keys(request)
        keys = every[:loadable]
        start = num_computed_tokens // self.block_size
        if len(keys) <= start:
            self._drop_posted_lookup(posted)
            return 0, False
        if posted is not None and (posted.keys != every or time.monotonic() - posted.asked > POSTED_LOOKUP_FRESH_S):
            self._drop_posted_lookup(posted)  # stale, or asked about other blocks
            posted = None
        started, trips = time.perf_counter(), self.index.round_trips
        asked = time.monotonic()
        # Every full block is asked about, the one holding the last token too (never offered): when
        # it is present as well, this request's save skips it instead of meeting "already there".
        if posted is not None:
            found, located, spare = self._take_posted(posted, every)
            asked = posted.asked
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

    def _lookup(self, keys: list[bytes]) -> tuple[int, list[Location | None] | None, list[int]]:
        """How many leading `keys` the pool has; where they are (with a read lease each), when this
        process can say (None: each worker looks its shard up); and leases this lookup took that
        hold no located block.

        With one rank the scheduler's namespace is the worker's: one GET_MANY burst answers both
        "how many" and "where", so a hit costs the scheduler one round trip, not a lookup and then a
        locate. The leases keep the blocks from eviction until the worker copied them. With several
        ranks: a LOOKUP_PREFIX here (its leases handed back after allocation), the locations found by
        each rank, under its own leases. Each rank holds its own shard under its own namespace; with
        MLA every rank copies the one copy, and one set of leases handed to all of them would be
        released by the first to finish while the others still read."""
        if self.tp_size == 1:
            located = locate_many(self.index, self.namespace, keys)
            found = next((i for i, loc in enumerate(located) if loc is None), len(located))
            return found, located, []
        found, leases = self.index.lookup_prefix_leased(self.namespace, keys)
        return found, None, leases

    def _take_posted(
        self, posted: _PostedLookup, keys: list[bytes]
    ) -> tuple[int, list[Location | None] | None, list[int]]:
        """`_lookup`'s answer from the lookup posted when the request arrived (one rank only)."""
        located = self.index.take_get_many(posted.ticket)
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
        """Hand back the lookup leases no longer needed, in one pipelined burst (none: no round trip)."""
        if not self._done_leases:
            return
        leases, self._done_leases = self._done_leases, []
        started, trips = time.perf_counter(), self.index.round_trips
        # Nothing was read under these: no live count to wait for.
        if not self.index.post_release(leases):
            self.index.release(leases)
        self.stats.add("lookup_release_us", int((time.perf_counter() - started) * 1e6))
        self.stats.add("lookup_release_round_trips", self.index.round_trips - trips)
        self.stats.add("lookup_leases_released", len(leases))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
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
        self._note_saves(meta)
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
        keys = self._block_keys(request)
        end = min(done, len(keys), len(state.block_ids))
        if end > start:
            meta.saves.append(BlockTransfer(req_id, state.block_ids[start:end], keys[start:end]))
            state.saving = True

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # With asynchronous saves a request we planned a save for keeps its blocks until every worker
        # reported its saves complete (get_finished); the others are freed now.
        state = self._requests.pop(request.request_id, None)
        self._drop_pending_hit(request.request_id)
        self._drop_posted_lookup(self._posted_lookups.pop(request.request_id, None))
        return bool(state is not None and state.saving and self.async_saves), None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from belugactl.dataplane.kvcopy import KVBlockLayout

        layout = KVBlockLayout.from_tensors(kv_caches)
        self.stats.set("block_nbytes", layout.block_nbytes)
        self.stats.set("pieces_per_block", layout.pieces_per_block)
        self.index.warm_up()
        if self.cfg.pool_path is None:
            log.warning("Beluga: no pool_path in kv_connector_extra_config; saving and loading nothing")
            return
        try:
            from belugactl.pool.mapping import PoolMapping

            self._pool = PoolMapping.open(self.cfg.pool_path)
        except Exception as exc:  # noqa: BLE001 - no pool means no cache, not no service
            log.warning("Beluga: cannot map the pool %s (%s); saving and loading nothing", self.cfg.pool_path, exc)
            self.stats.set("pool_error", str(exc))
            return
        if layout.device == "cpu":
            from belugactl.dataplane.kvcopy import KVCopyEngine

            self._engine = KVCopyEngine(layout, self._pool.buf, coherence=self.cfg.coherence)  # type: ignore[arg-type]
        else:
            from belugactl.dataplane.kvcopy_cuda import CudaKVCopyEngine

            self._engine = CudaKVCopyEngine(layout, self._pool.buf, coherence=self.cfg.coherence)
        self._transfer.engine = self._engine
        self._prefault = PoolPrefault(self._pool, self.stats, max_bytes=self.cfg.prefault_max_bytes)
        self._prefault.start()
        self.layerwise_loads = layerwise_loads_for(self.cfg.layerwise_loads, layout.device) and hasattr(
            self._engine, "layer_plan"
        )
        load_mode = "layer-wise" if self.layerwise_loads else "before the forward pass"
        self.stats.set("load_mode", load_mode)
        log.info(
            "Beluga: %d-byte blocks in %d pieces, pool %s (%d bytes), loads %s (layerwise_loads: %s)",
            layout.block_nbytes,
            layout.pieces_per_block,
            self.cfg.pool_path,
            self._pool.size,
            load_mode,
            self.cfg.layerwise_loads,
        )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, BelugaConnectorMetadata) or not meta.loads:
            return
        self._finish_layer_load()  # never two loads in flight into the same tensors
        if self.layerwise_loads and self._start_layerwise(meta.loads):
            return
        for transfer in meta.loads:
            self._load_errors.update(self._transfer.load(*transfer.load_args()))

    def _start_layerwise(self, loads: list[BlockTransfer]) -> bool:
        """Look the step's blocks up, then copy them layer by layer on the load thread (overlap.py).
        False when a batch cannot go layer-wise (a block split over extents): load it whole."""
        batches = []
        plans = []
        for transfer in loads:
            batch = self._transfer.prepare_load(*transfer.load_args())
            if batch is None:
                self._load_errors.update(transfer.block_ids)
                continue
            try:
                plan = self._engine.layer_plan(batch.blocks) if batch.blocks else []
            except ValueError as exc:
                # An extent outside the pool or a block id outside the tensors: recompute the batch.
                self._load_errors.update(self._transfer.finish_load(batch, None, exc, time.perf_counter()))
                continue
            if plan is None:
                started = time.perf_counter()
                error: Exception | None = None
                crcs = None
                try:
                    crcs = list(self._transfer._copy(batch.blocks, save=False))
                except Exception as exc:  # noqa: BLE001
                    error = exc
                self._load_errors.update(self._transfer.finish_load(batch, crcs, error, started))
                continue
            if not batch.blocks:
                self._load_errors.update(self._transfer.finish_load(batch, [], None, time.perf_counter()))
                continue
            batches.append(batch)
            plans.append(plan)
        if not batches:
            return True
        job = LayerwiseLoad(lc.layer for lc in plans[0])
        if self._load_thread is None:
            self._load_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="beluga-load")
        self._layer_load = job
        self.stats.add("layerwise_loads")
        self._load_thread.submit(
            run_layerwise, job, self._engine, batches, plans, self._transfer.pool_checksums, self._transfer.finish_load
        )
        return True

    def _finish_layer_load(self) -> None:
        job, self._layer_load = self._layer_load, None
        if job is not None:
            self._load_errors.update(job.wait())
            self.stats.add("layer_waits", job.layers_waited)
            self.stats.add("layer_wait_us", job.wait_us)

    def wait_for_layer_load(self, layer_name: str) -> None:
        job = self._layer_load
        if job is not None:
            job.wait_layer(layer_name)  # only this layer's pieces: later layers keep arriving

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # a block is saved whole (all layers) from wait_for_save, per step, off the critical path

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, BelugaConnectorMetadata) or not meta.saves:
            return
        if self.async_saves:
            # Every rank holds what the scheduler holds, whether or not it saves anything itself.
            self._async_saves().hold(t.req_id for t in meta.saves)
        if self._engine is None:
            return
        if self.mla and self.tp_rank != 0:
            return  # rank 0 stores the one copy every rank loads
        if hasattr(self._engine, "synchronize"):
            self._engine.synchronize()  # the GPU must have finished writing this step's KV
        for transfer in meta.saves:
            if self.async_saves:
                self._async_saves().submit(transfer.req_id, list(transfer.block_ids), list(transfer.keys))
                self.stats.add("async_saves")
            else:
                self._transfer.save(transfer.block_ids, transfer.keys)

    def _async_saves(self) -> AsyncSaves:
        if self._saves is None:
            self._saves = AsyncSaves(self._transfer.save)
        return self._saves

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # Called before the step's forward pass: a preempted request's freed blocks may be written by
        # another request in this very step, so its saves must have read them by then.
        preempted = getattr(kv_connector_metadata, "preempted", None)
        if preempted and self._saves is not None:
            waited = self._saves.drain(preempted)
            if waited:
                self.stats.add("saves_drained_for_preemption", waited)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._saves is None:
            return None, None
        done = self._saves.finished(finished_req_ids)
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._finish_layer_load()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._finish_layer_load()
        if self._saves is not None:
            self._saves.close()
        if self._load_thread is not None:
            self._load_thread.shutdown(wait=True)
        self.stats.flush()
        self.index.close()
        if self._prefault is not None:
            self._prefault.stop()
        if self._pool is not None:
            self._engine = None
            with contextlib.suppress(Exception):  # views into the mapping may still be alive
                self._pool.close()

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a later miss, not a lost answer

    # ------------------------------------------------------------------ vLLM's KV events and metrics
    # (kv_events.py, vllm_metrics.py): the pool's BlockStored/BlockRemoved through vLLM's publisher,
    # the connector's counters in vLLM's log line and /metrics.
    def _init_observability(self, vllm_config: VllmConfig, role: KVConnectorRole) -> None:
        extra = self.cfg.extra
        self._events_on = events_enabled(vllm_config)
        self._medium = str(extra.get("kv_events_medium") or DEFAULT_MEDIUM)
        self._commits = CommitObserver(self.index, enabled=self._events_on)
        self._trips_reported = 0
        self._events: SchedulerEvents | None = None
        if self._events_on and role == KVConnectorRole.SCHEDULER:
            self._events = SchedulerEvents(
                index=self.index,
                namespace=self.namespace,
                block_size=self.block_size,
                ranks=1 if self.mla else self.tp_size,  # who stores each block (MLA: rank 0 only)
                stats=self.stats,
                medium=self._medium,
                poll_s=float(extra.get("kv_events_poll_s", DEFAULT_POLL_S)),
            )

    def _note_saves(self, meta: BelugaConnectorMetadata) -> None:
        if self._events is not None and meta.saves:
            self._events.note_saves(meta.saves, self._requests, self._block_keys)

    def get_kv_connector_kv_cache_events(self) -> BelugaKVEvents | None:
        if not self._events_on:
            return None
        return worker_events(self._commits, self.block_size, self._medium)

    def update_connector_output(self, connector_output: Any) -> None:
        if self._events is not None:
            self._events.absorb(getattr(connector_output, "kv_cache_events", None))
        super().update_connector_output(connector_output)

    def take_events(self) -> Iterable[KVCacheEvent]:
        if self._events is None:
            return ()
        return self._events.take()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        extra: dict[str, int] = {}
        if self._role == KVConnectorRole.SCHEDULER:
            # The scheduler's round trips: lookups, block locations, removal polls.
            trips = self.index.round_trips
            extra["lookup_round_trips"] = trips - self._trips_reported
            self._trips_reported = trips
        stats = BelugaKVConnectorStats.from_connector_stats(self.stats, **extra)
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return BelugaKVConnectorStats(data=data) if data is not None else BelugaKVConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return BelugaPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
