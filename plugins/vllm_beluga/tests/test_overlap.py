"""Layer-wise loads and asynchronous saves (overlap.py) against a real metadata server and a real file
pool: each layer is usable as soon as its own pieces landed, a bad block is still caught after the
copy, and a finished request's blocks are given back to vLLM only once its saves read them."""

from __future__ import annotations

import mmap
import os
import threading
import time

import pytest
from test_transfer import NS, PIECE, _block, _present, tensors  # noqa: F401 - fixtures
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.overlap import AsyncSaves, LayerwiseLoad, run_layerwise
from vllm_beluga.stats import ConnectorStats
from vllm_beluga.transfer import PoolTransfer

from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address
from belugactl.pool.mapping import PoolMapping

WAIT_S = 10.0


class _GatedEngine(KVCopyEngine):
    """Copies a layer only once the test opens that layer's gate, so the test sees the moment between."""

    gates: dict[str, threading.Event]

    def copy_layer(self, layer, *, nontemporal=False):  # noqa: ANN001, ANN201 - the engine's signature
        assert self.gates[layer.layer].wait(WAIT_S), f"gate {layer.layer} never opened"
        return super().copy_layer(layer, nontemporal=nontemporal)


def _setup(server, tensors, engine_cls=KVCopyEngine):  # noqa: ANN001, ANN202, F811
    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    stats = ConnectorStats(None, role="worker0")
    index = BestEffortIndex(server.tcp, stats=stats, timeout_s=1.0, retry_s=0.2)
    engine = engine_cls(layout, pool.buf)
    return bufs, pool, PoolTransfer(index, engine, NS, stats)


def _start(t: PoolTransfer, block_ids, keys) -> tuple[LayerwiseLoad, threading.Thread]:  # noqa: ANN001
    batch = t.prepare_load(block_ids, keys)
    plan = t.engine.layer_plan(batch.blocks)
    job = LayerwiseLoad(lc.layer for lc in plan)
    thread = threading.Thread(
        target=run_layerwise, args=(job, t.engine, [batch], [plan], t.pool_checksums, t.finish_load), daemon=True
    )
    thread.start()
    return job, thread


def test_each_layer_is_usable_once_its_own_pieces_landed(server, tensors) -> None:  # noqa: F811
    bufs, _, t = _setup(server, tensors, _GatedEngine)
    t.engine.gates = {name: threading.Event() for name in ("l0", "l1", "l2")}
    keys = [b"a", b"b"]
    assert t.save([0, 1], keys) == 2
    job, thread = _start(t, [5, 6], keys)
    t.engine.gates["l0"].set()
    job.wait_layer("l0")
    # Layer 0 of both blocks is in place while layers 1 and 2 are still on their way.
    assert bufs[0][5 * PIECE : 6 * PIECE] == bufs[0][0:PIECE]
    assert bufs[0][6 * PIECE : 7 * PIECE] == bufs[0][PIECE : 2 * PIECE]
    assert bufs[1][5 * PIECE : 6 * PIECE] != bufs[1][0:PIECE]
    assert not job.done
    waiter = threading.Thread(target=job.wait_layer, args=("l2",), daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # layer 2 waits for its own copy, not just any progress
    t.engine.gates["l1"].set()
    t.engine.gates["l2"].set()
    waiter.join(WAIT_S)
    assert job.wait() == []
    thread.join(WAIT_S)
    assert _block(bufs, 5) == _block(bufs, 0) and _block(bufs, 6) == _block(bufs, 1)
    assert t.stats.get("loaded_blocks") == 2
    assert t.index.connect_now() and t.index._client.stats()["leases"] == 0  # released after the copy
    t.index.close()


def test_a_block_overwritten_after_commit_is_still_caught_after_a_layer_wise_copy(server, tensors) -> None:  # noqa: F811
    bufs, pool, t = _setup(server, tensors)
    assert t.save([0, 1], [b"a", b"b"]) == 2
    loc = t.index.get_many_tuples(NS, [b"b"])[0]
    t.index.release([loc[1]])
    off, n = loc[0][0]
    pool.write(off + n - 64, b"\x5a" * 64)  # a stalled writer, in the last layer's piece
    job, thread = _start(t, [6, 7], [b"a", b"b"])
    assert job.wait() == [7]  # reported after the forward pass: vLLM discards and recomputes it
    thread.join(WAIT_S)
    assert _block(bufs, 6) == _block(bufs, 0)
    assert t.stats.get("load_checksum_mismatch") == 1
    assert _present(t.index, [b"b"]) == 0
    t.index.close()


def test_a_failing_copy_releases_every_layer_and_fails_every_block(server, tensors) -> None:  # noqa: F811
    class Broken(KVCopyEngine):
        def copy_layer(self, layer, *, nontemporal=False):  # noqa: ANN001, ANN201
            if layer.layer == "l1":
                raise OSError("device gone")
            return super().copy_layer(layer, nontemporal=nontemporal)

    _, _, t = _setup(server, tensors, Broken)
    assert t.save([0, 1], [b"a", b"b"]) == 2
    job, thread = _start(t, [5, 6], [b"a", b"b"])
    job.wait_layer("l2")  # does not hang
    assert sorted(job.wait()) == [5, 6]
    thread.join(WAIT_S)
    assert t.index.connect_now() and t.index._client.stats()["leases"] == 0
    t.index.close()


def test_layer_spans_follow_the_tensors_and_shift_the_pool_offsets() -> None:
    # Two layers stored K and V apart (a GPU-like layout: an outer dimension of 2), 4 blocks of 256 B.
    bufs = [mmap.mmap(-1, 2 * 4 * 256) for _ in range(2)]
    views = [
        TensorView(f"layer{i}", buffer_address(b), (2, 4, 256), (1024, 256, 1), 1, "uint8")
        for i, b in enumerate(bufs)
    ]
    # Blocks are dimension 0 for the engine: give it the standard (blocks first) view.
    views = [TensorView(v.name, v.address, (4, 2, 256), (256, 1024, 1), 1, "uint8") for v in views]
    layout = KVBlockLayout.from_views(views)
    spans = layout.layer_spans()
    assert [(s.layer, s.first, s.count, s.offset, s.nbytes) for s in spans] == [
        ("layer0", 0, 2, 0, 512),
        ("layer1", 2, 2, 512, 512),
    ]
    pool = bytearray(1 << 16)
    engine = KVCopyEngine(layout, pool)
    plan = engine.layer_plan([(3, [(4096, 1024)]), (1, [(8192, 1024)])])
    assert plan is not None
    assert list(plan[1].pairs) == [3, 4096 + 512, 1, 8192 + 512]
    assert len(plan[1].template) == 6
    with pytest.raises(ValueError, match="outside"):
        engine.layer_plan([(9, [(0, 1024)])])
    assert engine.layer_plan([(0, [(0, 512), (4096, 512)])]) is None  # split over extents: load it whole
    # Each layer's copy puts that layer's bytes, and only those, in the tensors.
    for b in bufs:
        b[:] = bytes(len(b))
    pool[4096 : 4096 + 1024] = os.urandom(1024)
    plan = engine.layer_plan([(3, [(4096, 1024)])])
    engine.copy_layer(plan[0])
    assert bufs[0][3 * 256 : 4 * 256] == pool[4096 : 4096 + 256]
    assert bufs[0][1024 + 3 * 256 : 1024 + 4 * 256] == pool[4096 + 256 : 4096 + 512]
    assert bufs[1][3 * 256 : 4 * 256] == bytes(256)
    engine.copy_layer(plan[1])
    assert bufs[1][3 * 256 : 4 * 256] == pool[4096 + 512 : 4096 + 768]
    del engine
    for b in bufs:
        b.close()


def test_a_finished_requests_blocks_are_given_back_only_after_its_saves_read_them() -> None:
    gate = threading.Event()
    saved: list[list[int]] = []

    def run_save(block_ids: list[int], keys: list[bytes]) -> int:
        assert gate.wait(WAIT_S)
        saved.append(block_ids)
        return len(block_ids)

    saves = AsyncSaves(run_save)
    saves.submit("r1", [1, 2], [b"a", b"b"])
    saves.submit("r1", [3], [b"c"])
    saves.hold(["r2"])  # the scheduler planned a save r2's worker had nothing to copy for
    assert saves.finished({"r1", "r2", "r3"}) == {"r2"}  # r3 was never held: never reported
    assert saves.finished(set()) == set()  # r1 still being read
    assert saves.pending("r1") == 2
    gate.set()
    assert saves.drain() == 2
    assert saves.finished(set()) == {"r1"}  # remembered from the earlier call
    assert saves.finished({"r1"}) == set()  # reported once
    assert saved == [[1, 2], [3]]
    saves.close()


def test_a_preempted_requests_saves_finish_before_its_blocks_are_reused() -> None:
    gate = threading.Event()
    order: list[str] = []

    def run_save(block_ids: list[int], keys: list[bytes]) -> int:
        assert gate.wait(WAIT_S)
        time.sleep(0.05)
        order.append("saved")
        return 1

    saves = AsyncSaves(run_save)
    saves.submit("p", [4], [b"k"])
    drained = threading.Thread(target=lambda: (saves.drain(["p"]), order.append("drained")), daemon=True)
    drained.start()
    drained.join(0.3)
    assert drained.is_alive()  # the step's forward pass may not start yet
    assert saves.drain(["other"]) == 0  # other requests do not wait
    gate.set()
    drained.join(WAIT_S)
    assert order == ["saved", "drained"]
    saves.close()


def test_a_failing_save_still_hands_the_blocks_back() -> None:
    def run_save(block_ids: list[int], keys: list[bytes]) -> int:
        raise OSError("pool unmapped")

    saves = AsyncSaves(run_save)
    saves.submit("r", [1], [b"k"])
    saves.drain()
    assert saves.errors == 1
    assert saves.finished({"r"}) == {"r"}
    saves.close()


def test_checks_and_releases_run_on_the_waiting_thread_never_on_the_load_thread(server, tensors) -> None:  # noqa: F811
    # Python on the load thread would fight the forward pass for the GIL (a switch interval each time);
    # it only copies and checksums, and whoever waits for the job checks and releases.
    bufs, _, t = _setup(server, tensors)
    assert t.save([0, 1], [b"a", b"b"]) == 2
    finished_on: list[str] = []
    real_finish = t.finish_load

    def finish(*args):  # noqa: ANN002, ANN202
        finished_on.append(threading.current_thread().name)
        return real_finish(*args)

    t.finish_load = finish  # type: ignore[method-assign]
    job, thread = _start(t, [5, 6], [b"a", b"b"])
    thread.join(WAIT_S)
    assert job.done and finished_on == []  # copied and checksummed; nothing checked or released yet
    assert t.index._client.stats()["leases"] == 2
    assert job.wait() == [] and job.wait() == []  # finished once, on this thread
    assert finished_on == [threading.current_thread().name]
    assert t.index._client.stats()["leases"] == 0
    assert _block(bufs, 5) == _block(bufs, 0) and _block(bufs, 6) == _block(bufs, 1)
    t.index.close()


def test_a_load_thread_that_stops_half_way_leaves_every_batch_failed_and_released(server, tensors) -> None:  # noqa: F811
    bufs, _, t = _setup(server, tensors)
    assert t.save([0, 1], [b"a", b"b"]) == 2

    def checksum(blocks):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt  # escapes the thread's own error handling

    batch = t.prepare_load([5, 6], [b"a", b"b"])
    plan = t.engine.layer_plan(batch.blocks)
    job = LayerwiseLoad(lc.layer for lc in plan)
    with pytest.raises(KeyboardInterrupt):
        run_layerwise(job, t.engine, [batch], [plan], checksum, t.finish_load)
    assert sorted(job.wait()) == [5, 6]  # never trusted without its checksum
    assert t.index._client.stats()["leases"] == 0
    t.index.close()


def test_load_time_counts_the_copy_and_the_check_not_the_wait_in_between(server, tensors) -> None:  # noqa: F811
    bufs, _, t = _setup(server, tensors)
    assert t.save([0, 1], [b"a", b"b"]) == 2
    job, thread = _start(t, [5, 6], [b"a", b"b"])
    thread.join(WAIT_S)
    time.sleep(0.5)  # the forward pass, before anyone waits for the job
    assert job.wait() == []
    assert 0 < t.stats.get("load_us") < 400_000
    t.index.close()
