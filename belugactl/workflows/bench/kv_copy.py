"""`bench kv`: KV block save/load through the copy engine, side by side with its limit and the naive way.

Shape: Qwen-32B with vLLM's 16-token blocks on GPUs: 64 layers, K and V apart, 8 KV heads x 128 dims,
bf16: 128 pieces of 32 KiB per block (4 MiB). The paged tensors are one buffer per layer laid out
[K|V][block][16][8][128] (K/V outside the block, as GPU backends keep them). In one run:
- contiguous: one copy of the same number of bytes into the same pool bytes (the limit: memory
  bandwidth); contiguous_read: the same out of the pool;
- per-piece: one copy call per 32 KiB piece from a Python loop (the naive way);
- engine save (gather-write) and load (scatter-read): `KVCopyEngine`, one native call per batch.

Same memory on both sides of the comparison: the KV tensors, the contiguous copy's source and the
pool are private anonymous mappings with huge pages advised (a devdax pool is 2 MiB-paged), and
every page of all three is written before timing, so no copy pays first-touch page faults. That is
the steady state of a serving pool (its pages were touched long before; a devdax mapping faults
once per 2 MiB at most). Above glibc's non-temporal threshold (114 MiB on the dev VM) the contiguous
copy streams with non-temporal stores, as the engine does for batches of 1 MiB or more.
The steps take turns over `repeat` rounds; each result has the ratio of the medians
(`vs_contiguous`) and the median of the per-round ratios (`vs_contiguous_paired`), so machine noise
hits all of them alike. The load average at the end of the run is in the result.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LAYERS = 64
TOKENS = 16
KV_HEADS = 8
HEAD_DIM = 128
ITEMSIZE = 2  # bf16
PIECE = TOKENS * KV_HEADS * HEAD_DIM * ITEMSIZE  # 32 KiB


@dataclass(frozen=True)
class KVShape:
    layers: int = LAYERS
    tokens: int = TOKENS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    itemsize: int = ITEMSIZE

    @property
    def piece(self) -> int:
        return self.tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def block_nbytes(self) -> int:
        return 2 * self.layers * self.piece


def _interleaved(steps: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Seconds per step and round, the steps taking turns, so a noisy neighbour hurts all of them alike."""
    for fn in steps.values():
        fn()  # first touch: page tables, caches
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, fn in steps.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return samples


def _mapping(size: int) -> mmap.mmap:
    # Private: shared anonymous memory is shmem, which gets no transparent huge pages by default.
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):
        m.madvise(mmap.MADV_HUGEPAGE)
    return m


def run_cpu(
    blocks: int = 64, *, repeat: int = 5, coherence: str = "none", shape: KVShape = KVShape()
) -> dict[str, Any]:
    from belugactl.dataplane import native
    from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address

    per_layer = 2 * blocks * shape.piece
    # One allocation for all layers, as vLLM allocates its KV cache; huge pages where the kernel gives
    # them (a devdax pool is mapped with 2 MiB pages too), so the comparison is not about TLB misses.
    kv = _mapping(per_layer * shape.layers)
    kv.write(os.urandom(4096) * (len(kv) // 4096))
    base = buffer_address(kv)
    views = [
        TensorView(
            name=f"model.layers.{i}.self_attn.attn",
            address=base + i * per_layer,
            shape=(blocks, 2, shape.tokens, shape.kv_heads, shape.head_dim),
            strides=(
                shape.piece,
                blocks * shape.piece,
                shape.kv_heads * shape.head_dim * shape.itemsize,
                shape.head_dim * shape.itemsize,
                shape.itemsize,
            ),
            itemsize=shape.itemsize,
            dtype="bfloat16",
        )
        for i in range(shape.layers)
    ]
    layout = KVBlockLayout.from_views(views)
    total = blocks * layout.block_nbytes
    pool = _mapping(total)
    pool.write(bytes(total))  # fault every page in before timing
    source = _mapping(total)
    source.write(os.urandom(4096) * (total // 4096))
    engine = KVCopyEngine(layout, pool, coherence=coherence)  # type: ignore[arg-type]
    batch = [(b, [(b * layout.block_nbytes, layout.block_nbytes)]) for b in range(blocks)]
    nontemporal = coherence == "flush"

    def contiguous() -> None:
        native.copy(pool, 0, source, 0, total, nontemporal)

    def contiguous_read() -> None:
        native.copy(source, 0, pool, 0, total, False)

    # The naive way: one copy per piece, issued from Python, as a per-piece cudaMemcpy loop would be.
    pieces = [
        (seg.base + b * seg.block_stride, b * layout.block_nbytes + k * shape.piece, seg.length)
        for b in range(blocks)
        for k, seg in enumerate(layout.segments)
    ]
    memmove = ctypes.memmove
    pool_base = buffer_address(pool)

    def per_piece() -> None:
        for src, dst, n in pieces:
            memmove(pool_base + dst, src, n)

    def save() -> None:
        engine.save(batch)

    def load() -> None:
        engine.load(batch)

    steps = {
        "contiguous": contiguous,
        "contiguous_read": contiguous_read,
        "per_piece": per_piece,
        "save": save,
        "load": load,
    }
    samples = _interleaved(steps, repeat)
    results: dict[str, dict[str, float]] = {
        name: {"seconds": statistics.median(ts), "gb_per_s": total / statistics.median(ts) / 1e9}
        for name, ts in samples.items()
    }
    # Correctness in the same run: what load puts back equals what save took.
    check_ok = _round_trip_ok(engine, layout, blocks)
    for m in (pool, source, kv):
        m.close()
    # Each direction against the contiguous copy in the same direction: into the pool (save, per-piece)
    # and out of it (load).
    # vs_contiguous: ratio of the medians. vs_contiguous_paired: median over rounds of the ratio
    # within a round (the two copies ran back to back), which a neighbour's burst disturbs less on
    # a shared machine.
    for name, r in results.items():
        base = "contiguous_read" if name in ("load", "contiguous_read") else "contiguous"
        r["vs_contiguous"] = r["gb_per_s"] / results[base]["gb_per_s"]
        r["vs_contiguous_paired"] = statistics.median(
            b / t for t, b in zip(samples[name], samples[base], strict=True)
        )
    return {
        "device": "cpu",
        "shape": {
            "layers": shape.layers,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "tokens_per_block": shape.tokens,
            "dtype": "bfloat16",
            "piece_bytes": shape.piece,
            "pieces_per_block": layout.pieces_per_block,
            "block_bytes": layout.block_nbytes,
        },
        "blocks": blocks,
        "bytes": total,
        "coherence": coherence,
        "native_helper": native.AVAILABLE,
        "results": results,
        "round_trip_ok": check_ok,
        "repeat": repeat,
        "load_average": list(os.getloadavg()),
        "target": {"save_and_load_vs_contiguous": 0.8},
    }


def _round_trip_ok(engine: Any, layout: Any, blocks: int) -> bool:
    """Save block 0, scribble over it, load it back: the bytes must match."""
    first = layout.segments[0]
    before = ctypes.string_at(first.base, first.length)
    engine.save([(0, [(0, layout.block_nbytes)])])
    ctypes.memset(first.base, 0xAB, first.length)
    engine.load([(0, [(0, layout.block_nbytes)])])
    return ctypes.string_at(first.base, first.length) == before


def run_cuda(blocks: int = 64, *, repeat: int = 5, shape: KVShape = KVShape()) -> dict[str, Any]:
    from belugactl.dataplane.kvcopy_cuda import bench_cuda

    return bench_cuda(blocks=blocks, repeat=repeat, layers=shape.layers, piece=shape.piece)
