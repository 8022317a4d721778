"""The connector's worker side (one per tensor-parallel rank): copies between the KV tensors and the pool.

Before the forward pass, look each key up (a read lease), copy its extents into the paged KV tensors
and release the lease; blocks that cannot be loaded are reported through
`get_block_ids_with_load_errors` (vLLM recomputes them with `kv_load_failure_policy: recompute`).
After the forward pass, reserve extents for a request's new full blocks in one burst, copy all their
layers' pieces there in one batch, and commit them in one burst: a block is visible to other
instances only after its bytes are in the pool. The copies themselves are transfer.py's; overlapping
them with the forward pass is overlap.py's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from vllm_beluga.config import layerwise_loads_for
from vllm_beluga.context import ConnectorContext
from vllm_beluga.kv_events import BelugaKVEvents, CommitObserver, worker_events
from vllm_beluga.metadata import BelugaConnectorMetadata, BlockTransfer
from vllm_beluga.overlap import AsyncSaves, LayerwiseLoad, run_layerwise
from vllm_beluga.prefault import PoolPrefault
from vllm_beluga.transfer import PoolTransfer

if TYPE_CHECKING:
    import torch

log = logging.getLogger("vllm.beluga")


class BelugaWorker:
    def __init__(self, ctx: ConnectorContext) -> None:
        self.ctx = ctx
        self.stats = ctx.stats
        self.index = ctx.index
        self.engine: Any = None  # KVCopyEngine (CPU) or CudaKVCopyEngine, once the KV caches are known
        self._pool: Any = None
        self._prefault: PoolPrefault | None = None
        self._load_errors: set[int] = set()
        self._commits = CommitObserver(self.index, enabled=ctx.events_on)
        self._transfer = PoolTransfer(self._commits, None, ctx.namespace, self.stats)
        # Decided once the KV tensors and the copy engine are known (register_kv_caches): "auto"
        # depends on the tensors' device, and only an engine with `layer_plan` copies by layer.
        self.layerwise_loads = False
        self._layer_load: LayerwiseLoad | None = None
        self._load_thread: ThreadPoolExecutor | None = None
        self._saves: AsyncSaves | None = None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from belugactl.dataplane.kvcopy import KVBlockLayout

        cfg = self.ctx.cfg
        layout = KVBlockLayout.from_tensors(kv_caches)
        self.stats.set("block_nbytes", layout.block_nbytes)
        self.stats.set("pieces_per_block", layout.pieces_per_block)
        self.index.connect_now()
        if cfg.pool_path is None:
            log.warning("Beluga: no pool_path in kv_connector_extra_config; saving and loading nothing")
            return
        try:
            from belugactl.pool.mapping import PoolMapping

            self._pool = PoolMapping.open(cfg.pool_path)
        except Exception as exc:  # noqa: BLE001 - no pool means no cache, not no service
            log.warning("Beluga: cannot map the pool %s (%s); saving and loading nothing", cfg.pool_path, exc)
            self.stats.set("pool_error", str(exc))
            return
        self.index.use_pool(self._pool)
        if layout.device == "cpu":
            from belugactl.dataplane.kvcopy import KVCopyEngine

            self.engine = KVCopyEngine(layout, self._pool.buf, coherence=cfg.coherence)  # type: ignore[arg-type]
        else:
            from belugactl.dataplane.kvcopy_cuda import CudaKVCopyEngine

            self.engine = CudaKVCopyEngine(layout, self._pool.buf, coherence=cfg.coherence)
        self._transfer.engine = self.engine
        self._prefault = PoolPrefault(self._pool, self.stats, max_bytes=cfg.prefault_max_bytes)
        self._prefault.start()
        self.layerwise_loads = layerwise_loads_for(cfg.layerwise_loads, layout.device) and hasattr(
            self.engine, "layer_plan"
        )
        load_mode = "layer-wise" if self.layerwise_loads else "before the forward pass"
        self.stats.set("load_mode", load_mode)
        log.info(
            "Beluga: %d-byte blocks in %d pieces, pool %s (%d bytes), loads %s (layerwise_loads: %s)",
            layout.block_nbytes,
            layout.pieces_per_block,
            cfg.pool_path,
            self._pool.size,
            load_mode,
            cfg.layerwise_loads,
        )

    def start_load_kv(self, meta: Any) -> None:
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
                plan = self.engine.layer_plan(batch.blocks) if batch.blocks else []
            except ValueError as exc:
                # An extent outside the pool or a block id outside the tensors: recompute the batch.
                self._load_errors.update(self._transfer.finish_load(batch, None, exc, time.perf_counter()))
                continue
            if plan is None:
                started = time.perf_counter()
                error: Exception | None = None
                crcs = None
                try:
                    crcs = list(self._transfer.copy(batch.blocks, save=False))
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
            run_layerwise, job, self.engine, batches, plans, self._transfer.pool_checksums, self._transfer.finish_load
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

    def wait_for_save(self, meta: Any) -> None:
        if not isinstance(meta, BelugaConnectorMetadata) or not meta.saves:
            return
        if self.ctx.async_saves:
            # Every rank holds what the scheduler holds, whether or not it saves anything itself.
            self._async_saves().hold(t.req_id for t in meta.saves)
        if self.engine is None:
            return
        if self.ctx.mla and self.ctx.tp_rank != 0:
            return  # rank 0 stores the one copy every rank loads
        if hasattr(self.engine, "synchronize"):
            self.engine.synchronize()  # the GPU must have finished writing this step's KV
        for transfer in meta.saves:
            if self.ctx.async_saves:
                self._async_saves().submit(transfer.req_id, list(transfer.block_ids), list(transfer.keys))
                self.stats.add("async_saves")
            else:
                self._transfer.save(transfer.block_ids, transfer.keys)

    def _async_saves(self) -> AsyncSaves:
        if self._saves is None:
            self._saves = AsyncSaves(self._transfer.save)
        return self._saves

    def drain_saves(self) -> None:
        """Wait for every asynchronous save in flight (benchmarks: a hit must find every block)."""
        if self._saves is not None:
            self._saves.drain()

    def handle_preemptions(self, meta: Any) -> None:
        # Called before the step's forward pass: a preempted request's freed blocks may be written by
        # another request in this very step, so its saves must have read them by then.
        preempted = getattr(meta, "preempted", None)
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

    def kv_cache_events(self) -> BelugaKVEvents | None:
        """The keys this worker's saves committed since the last step, as vLLM's KV events."""
        if not self.ctx.events_on:
            return None
        return worker_events(self._commits, self.ctx.block_size, self.ctx.medium)

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
            self.engine = None
            with contextlib.suppress(Exception):  # views into the mapping may still be alive
                self._pool.close()
