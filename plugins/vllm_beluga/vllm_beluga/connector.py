"""BelugaConnector: vLLM KV blocks in a shared CXL pool, indexed by belugactl's metadata server.

vLLM makes one connector per process and role. This class only dispatches, as vLLM's own
connectors do: the scheduler's calls go to `BelugaScheduler` (scheduler.py: which blocks the pool
has, what to load and save each step), the workers' to `BelugaWorker` (worker.py: the copies).
Both sides derive the same namespace and settings from vLLM's config (context.py) and share the
step's `BelugaConnectorMetadata` (metadata.py).

Per-request switch (OpenAI `kv_transfer_params`): `{"beluga": {"load": false, "save": false}}`
turns the connector off for that request, e.g. to compare against a recompute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vllm_beluga.context import ConnectorContext
from vllm_beluga.kv_events import BelugaKVEvents
from vllm_beluga.scheduler import BelugaScheduler
from vllm_beluga.vllm_metrics import BelugaKVConnectorStats, BelugaPromMetrics
from vllm_beluga.worker import BelugaWorker

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class BelugaConnector(KVConnectorBase_V1):
    """Not `SupportsHMA`, on purpose: blocks are keyed and copied for one KV-cache group. Without
    that marker vLLM turns its hybrid allocator off, so a sliding-window model runs with every layer
    in one full-attention group (correct, at a memory cost, as with LMCache); a model that needs the
    hybrid allocator (Mamba/SSM layers) is refused by vLLM at start, and by context.py's check if a
    configuration forces several groups through anyway."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ctx = ConnectorContext.build(vllm_config, role, kv_cache_config, self._kv_transfer_config)
        self.cfg = ctx.cfg
        self.stats = ctx.stats
        self.index = ctx.index
        self.namespace = ctx.namespace
        self.connector_scheduler: BelugaScheduler | None = None
        self.connector_worker: BelugaWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = BelugaScheduler(ctx)
        else:
            self.connector_worker = BelugaWorker(ctx)

    def _scheduler(self) -> BelugaScheduler:
        assert self.connector_scheduler is not None, "a scheduler-side call on a worker's connector"
        return self.connector_scheduler

    def _worker(self) -> BelugaWorker:
        assert self.connector_worker is not None, "a worker-side call on the scheduler's connector"
        return self.connector_worker

    # ------------------------------------------------------------------ scheduler side
    def on_new_request(self, request: Request) -> None:
        self._scheduler().on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        if self.connector_scheduler is not None:
            self.connector_scheduler.absorb_events(getattr(connector_output, "kv_cache_events", None))
        super().update_connector_output(connector_output)

    def take_events(self) -> Iterable[KVCacheEvent]:
        if self.connector_scheduler is None:
            return ()
        return self.connector_scheduler.take_events()

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker().start_load_kv(self._connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # a block is saved whole (all layers) from wait_for_save, per step, off the critical path

    def wait_for_save(self) -> None:
        self._worker().wait_for_save(self._connector_metadata)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.connector_worker is not None:
            self.connector_worker.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.connector_worker is None:
            return None, None
        return self.connector_worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.connector_worker is None:
            return set()
        return self.connector_worker.get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self) -> BelugaKVEvents | None:
        if self.connector_worker is None:
            return None
        return self.connector_worker.kv_cache_events()

    # ------------------------------------------------------------------ both
    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a later miss, not a lost answer

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        extra: dict[str, int] = {}
        if self.connector_scheduler is not None:
            # The scheduler's round trips: lookups, block locations, removal polls.
            extra["lookup_round_trips"] = self.connector_scheduler.take_round_trips()
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
