"""What the scheduler side and the worker side both derive from vLLM's config, the same way.

A block's namespace (model, layout, tensor-parallel rank), the settings both sides read, and the
process's own stats file and best-effort index (each process its own client: the scheduler's ring,
or its tensor-parallel rank's).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from vllm_beluga.config import BelugaConfig, check_hash_pins, layout_id, namespace_for, refuse_hybrid
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.kv_events import DEFAULT_MEDIUM, events_enabled
from vllm_beluga.stats import ConnectorStats

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

# A child of vLLM's logger, so our lines land in vLLM's log with its format and level.
log = logging.getLogger("vllm.beluga")


@dataclass
class ConnectorContext:
    cfg: BelugaConfig
    block_size: int
    tp_size: int
    tp_rank: int
    # MLA: the latent KV is the same on every tensor-parallel rank, so the pool holds one copy
    # (rank 0 saves it, every rank loads it, all under one namespace) instead of tp_size copies.
    mla: bool
    namespace: str
    stats: ConnectorStats
    index: BestEffortIndex
    # Prefill/decode roles (vLLM's kv_role): a consumer loads and never saves (what it computes is
    # the decode); a producer saves synchronously, so its answer to the front door means "the
    # prompt's KV is in the pool" and the consumer asked next finds every block. A producer still
    # loads a prefix the pool already has: that is recompute saved, not a role broken.
    kv_role: str
    saves_enabled: bool
    # Overlap (overlap.py): on unless kv_connector_extra_config turns it off, which serve's
    # benchmarks do to measure what it saves. Scheduler and workers read the same config.
    async_saves: bool
    events_on: bool  # vLLM publishes KV events: the pool's side of them too (kv_events.py)
    medium: str

    @classmethod
    def build(
        cls,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None,
        kv_transfer_config: KVTransferConfig,
    ) -> ConnectorContext:
        """Check the config (hybrid models, hash pins) and derive the context; raises what vLLM
        shows as the reason it cannot start."""
        refuse_hybrid(kv_cache_config)
        cfg = BelugaConfig.from_extra(kv_transfer_config.kv_connector_extra_config or {})
        check_hash_pins(cfg, algo_in_use=str(vllm_config.cache_config.prefix_caching_hash_algo))
        if kv_transfer_config.kv_load_failure_policy != "recompute":
            log.warning(
                "Beluga: kv_load_failure_policy is %r; with 'recompute' a block that fails to load is recomputed "
                "instead of failing the request",
                kv_transfer_config.kv_load_failure_policy,
            )
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            try:
                tp_rank = get_tensor_model_parallel_rank()
            except Exception:  # noqa: BLE001 - not initialised in some single-process setups
                tp_rank = 0
            role_name = f"worker{tp_rank}"
        else:
            tp_rank = 0  # the scheduler asks about rank 0's blocks; other ranks report misses as load errors
            role_name = "scheduler"
        namespace = namespace_for(
            cfg.namespace,
            layout_id(layout_facts(vllm_config, kv_cache_config, cfg)),
            0 if mla else tp_rank,
            1 if mla else tp_size,
        )
        stats = ConnectorStats(cfg.stats_path, role=role_name)
        stats.set("namespace", namespace)
        index = BestEffortIndex(
            cfg.address_for("scheduler" if role == KVConnectorRole.SCHEDULER else "worker", tp_rank),
            stats=stats,
            timeout_s=cfg.timeout_s,
            retry_s=cfg.retry_s,
            handover_group=handover_group(kv_transfer_config),
            tenant=cfg.tenant,
        )
        log.info("Beluga connector (%s): namespace %s, server %s", role_name, namespace, index.address)
        kv_role = str(getattr(kv_transfer_config, "kv_role", "kv_both") or "kv_both")
        return cls(
            cfg=cfg,
            block_size=vllm_config.cache_config.block_size,
            tp_size=tp_size,
            tp_rank=tp_rank,
            mla=mla,
            namespace=namespace,
            stats=stats,
            index=index,
            kv_role=kv_role,
            saves_enabled=kv_role != "kv_consumer",
            async_saves=cfg.extra.get("async_saves", True) is not False and kv_role != "kv_producer",
            events_on=events_enabled(vllm_config),
            medium=str(cfg.extra.get("kv_events_medium") or DEFAULT_MEDIUM),
        )


def handover_group(kv_transfer_config: Any) -> int:
    """The 64-bit hand-over group the scheduler and the workers of one engine say in HELLO, so that a
    worker may release the leases its scheduler took and no other client may: derived from the
    engine's id (vLLM draws a uuid per engine and hands the same config to every worker). 0 without
    one: then every lease is released by the process that took it, or expires."""
    engine_id = getattr(kv_transfer_config, "engine_id", None)
    if not engine_id:
        return 0
    digest = hashlib.sha256(b"beluga-handover\0" + str(engine_id).encode()).digest()
    return int.from_bytes(digest[:8], "little") or 1


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
