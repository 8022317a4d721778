"""Copies out of the forward pass's way: layer-wise loads and asynchronous saves.

Loads. vLLM calls `start_load_kv` before the forward pass and `wait_for_layer_load(layer)` before
each attention layer reads its KV. A `LayerwiseLoad` copies the step's blocks one layer at a time on
a background thread, in model order, and each layer waits only for its own copy: layer 0 computes
while layers 1..N are still arriving. The checksum cannot be taken in a layer-sized copy, so it is
taken over the pool bytes once every layer landed (sound for the reason the CUDA path's is, see
transfer.py): a block that fails it is reported through `get_block_ids_with_load_errors` after the
forward pass, and vLLM then discards what that step computed for the request and recomputes the
block, so a wrong byte can cost a recompute, never an answer.

The load thread runs native copies and checksums only (the GIL released). Comparing the checksums,
releasing the leases and counting are Python, and run on the thread that waits for the load (the
forward pass's, after it): Python on the load thread during the forward pass fights the forward
pass for the GIL, and each switch between them can cost either side up to the interpreter's switch
interval (5 ms by default): in the CPU demo that made a lease release sent without waiting many
times slower than on a quiet thread.

Saves. `wait_for_save` hands a step's saves to a background thread and returns: the step's tokens
go back to the user without waiting for the pool. The blocks being saved must stay untouched until
the copy read them:
- a request that finishes: the scheduler side answers `request_finished` with True for every request
  it planned a save for, so vLLM keeps its blocks until this side reports the request in
  `get_finished` (finished sending), which it does only once every save of it completed;
- a request that is preempted (its blocks freed and possibly handed to another request in the same
  step): `handle_preemptions`, which vLLM calls before that step's forward pass, waits for the
  request's saves first.
Nothing else frees a running request's blocks; the KV of computed prompt tokens is never rewritten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("vllm.beluga")


class LayerwiseLoad:
    """One step's loads in flight: an event per layer, the failed block ids once all are done."""

    def __init__(self, layers: Iterable[str]) -> None:
        self._layers = {name: threading.Event() for name in layers}
        self._done = threading.Event()
        self.failed: list[int] = []
        self.layers_waited = 0
        self.wait_us = 0
        # What the load thread leaves for the waiting thread: per batch (batch, checksums, error),
        # the finishing call, and when the copies started.
        self._copied: list[tuple[Any, list[int] | None, Exception | None]] = []
        self._finish: Callable[[Any, list[int] | None, Exception | None, float], list[int]] | None = None
        self._started = 0.0
        self._copied_at = 0.0
        self._finished = False

    def layer_done(self, layer: str) -> None:
        event = self._layers.get(layer)
        if event is not None:
            event.set()

    def finish(self, failed: Iterable[int]) -> None:
        self.failed.extend(failed)
        for event in self._layers.values():
            event.set()  # a failed copy must not leave a layer waiting forever
        self._done.set()

    def wait_layer(self, layer: str) -> None:
        """Block until `layer`'s pieces landed. A layer without its own pieces (its tensor shares
        storage with another) or one this load does not know waits for the whole load."""
        started = time.perf_counter()
        event = self._layers.get(layer, self._done)
        event.wait()
        self.layers_waited += 1
        self.wait_us += int((time.perf_counter() - started) * 1e6)

    def copied(
        self,
        results: list[tuple[Any, list[int] | None, Exception | None]],
        finish: Callable[[Any, list[int] | None, Exception | None, float], list[int]],
        started: float,
    ) -> None:
        """The load thread is done copying: `finish` each batch when someone waits (`wait`)."""
        self._copied, self._finish, self._started = results, finish, started
        self._copied_at = time.perf_counter()
        self.finish(())

    def wait(self) -> list[int]:
        """Wait for the copies, then (once, on this thread) check and release each batch; the block
        ids not loaded."""
        self._done.wait()
        if not self._finished:
            self._finished = True
            finish, copied = self._finish, self._copied
            self._copied = []
            if finish is not None:
                # finish counts `load_us` from the start it is given to its own end: shifted so that
                # the count is the copy's own time plus the check, not the forward pass in between.
                started = time.perf_counter() - (self._copied_at - self._started)
                failed: list[int] = []
                for batch, crcs, error in copied:
                    try:
                        failed.extend(finish(batch, crcs, error, started))
                    except Exception as exc:  # noqa: BLE001 - reported per block, never raised into vLLM
                        log.warning("Beluga: finishing a layer-wise load failed: %s", exc)
                        failed.extend(b for b, _ in batch.blocks)
                        failed.extend(batch.failed)
                self.failed = sorted(set(self.failed) | set(failed))
        return self.failed

    @property
    def done(self) -> bool:
        return self._done.is_set()


def run_layerwise(
    job: LayerwiseLoad,
    engine: Any,
    batches: Sequence[Any],
    plans: Sequence[Sequence[Any]],
    checksum: Callable[[Sequence[tuple[int, Sequence[tuple[int, int]]]]], list[int]],
    finish: Callable[[Any, list[int] | None, Exception | None, float], list[int]],
) -> None:
    """The body of a layer-wise load (runs on the load thread): per layer, that layer's pieces of
    every batch; then each batch's checksums over the pool bytes. Each batch's check and release
    (`finish`) is left to the thread that waits for the job (LayerwiseLoad.wait)."""
    started = time.perf_counter()
    error: Exception | None = None
    results: list[tuple[Any, list[int] | None, Exception | None]] = []
    try:
        try:
            for batch in batches:
                engine.flush_extents(batch.blocks)
            layer_names = [lc.layer for lc in plans[0]] if plans else []
            nontemporal = engine.nontemporal_for([b for batch in batches for b in batch.blocks])
            for i, layer in enumerate(layer_names):
                for plan in plans:
                    engine.copy_layer(plan[i], nontemporal=nontemporal)
                job.layer_done(layer)
        except Exception as exc:  # noqa: BLE001 - reported per block by finish, never raised into vLLM
            error = exc
        for batch in batches:
            crcs = None
            failed_here = error
            if error is None:
                try:
                    crcs = checksum(batch.blocks)
                except Exception as exc:  # noqa: BLE001 - this batch cannot be trusted: recomputed
                    failed_here = exc
            results.append((batch, crcs, failed_here))
    finally:
        if len(results) < len(batches):  # stopped half way: the rest is recomputed, never trusted
            stopped = error or RuntimeError("the load thread stopped before checksumming")
            results += [(batch, None, stopped) for batch in batches[len(results) :]]
        job.copied(results, finish, started)


class AsyncSaves:
    """A step's saves on a background thread, and which finished requests may have their blocks back.

    `run_save(block_ids, keys)` does one save (reserve, copy, commit); it runs on one thread, one
    at a time, in submission order."""

    def __init__(self, run_save: Callable[[list[int], list[bytes]], int], *, name: str = "beluga-save") -> None:
        self._run_save = run_save
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._inflight: dict[str, list[Future[Any]]] = {}
        self._held: set[str] = set()  # requests whose blocks the scheduler keeps for us
        self._finished: set[str] = set()  # finished in vLLM, blocks held until their saves end
        self.errors = 0

    def hold(self, req_ids: Iterable[str]) -> None:
        """The scheduler planned saves for these requests: it will not free their blocks at finish
        until `finished` reports them (its `request_finished` answered True)."""
        with self._lock:
            self._held.update(req_ids)

    def submit(self, req_id: str, block_ids: list[int], keys: list[bytes]) -> Future[Any]:
        with self._lock:
            self._held.add(req_id)
            future = self._executor.submit(self._save, block_ids, keys)
            self._inflight.setdefault(req_id, []).append(future)
        future.add_done_callback(lambda f, r=req_id: self._done(r, f))
        return future

    def _save(self, block_ids: list[int], keys: list[bytes]) -> int:
        try:
            return self._run_save(block_ids, keys)
        except Exception as exc:  # noqa: BLE001 - a failed save is a later miss
            self.errors += 1
            log.warning("Beluga: an asynchronous save of %d blocks failed: %s", len(block_ids), exc)
            return 0

    def _done(self, req_id: str, future: Future[Any]) -> None:
        with self._lock:
            pending = self._inflight.get(req_id)
            if pending is not None:
                if future in pending:
                    pending.remove(future)
                if not pending:
                    del self._inflight[req_id]

    def pending(self, req_id: str | None = None) -> int:
        with self._lock:
            if req_id is None:
                return sum(len(v) for v in self._inflight.values())
            return len(self._inflight.get(req_id, ()))

    def finished(self, finished_req_ids: Iterable[str]) -> set[str]:
        """vLLM's `get_finished` for saves: of the held requests vLLM says finished (now or before),
        those whose saves all completed. Only held requests are ever reported: the scheduler
        freed the others' blocks already and knows nothing to wait for."""
        with self._lock:
            self._finished.update(r for r in finished_req_ids if r in self._held)
            ready = {r for r in self._finished if r not in self._inflight}
            self._finished -= ready
            self._held -= ready
        return ready

    def drain(self, req_ids: Iterable[str] | None = None) -> int:
        """Wait for the saves of `req_ids` (every save when None); returns how many were waited for."""
        with self._lock:
            if req_ids is None:
                futures = [f for v in self._inflight.values() for f in v]
            else:
                futures = [f for r in req_ids for f in self._inflight.get(r, ())]
        for future in futures:
            future.result()
        return len(futures)

    def close(self) -> None:
        self.drain()
        self._executor.shutdown(wait=True)
