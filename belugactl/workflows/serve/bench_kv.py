"""`bench kv`: KV block save/load through the copy engine, side by side with its limit and the naive way.

Shape: Qwen-32B with vLLM's 16-token blocks on GPUs: 64 layers, K and V apart, 8 KV heads x 128 dims,
bf16: 128 pieces of 32 KiB per block (4 MiB). The paged tensors are one buffer per layer laid out
[K|V][block][16][8][128] (K/V outside the block, as GPU backends keep them); the pool is a MAP_SHARED
file mapping. In one run:
- contiguous: one copy of the same number of bytes (the limit: memory bandwidth);
- per-piece: one copy call per 32 KiB piece from a Python loop (the naive way);
- engine save (gather-write) and load (scatter-read): `KVCopyEngine`, one native call per batch.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import statistics
import tempfile
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


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) if repeat < 3 else statistics.median(times)


def run_cpu(
    blocks: int = 64, *, repeat: int = 5, coherence: str = "none", shape: KVShape = KVShape()
) -> dict[str, Any]:
    from belugactl.dataplane import native
    from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address

    per_layer = 2 * blocks * shape.piece
    layers = [mmap.mmap(-1, per_layer) for _ in range(shape.layers)]
    for buf in layers:
        buf.write(os.urandom(4096) * (per_layer // 4096))
    views = [
        TensorView(
            name=f"model.layers.{i}.self_attn.attn",
            address=buffer_address(buf),
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
        for i, buf in enumerate(layers)
    ]
    layout = KVBlockLayout.from_views(views)
    total = blocks * layout.block_nbytes
    with tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        f.truncate(total)
        pool = mmap.mmap(f.fileno(), total, flags=mmap.MAP_SHARED)
        pool[:] = bytes(total)  # fault every page in before timing
        source = mmap.mmap(-1, total)
        source.write(os.urandom(4096) * (total // 4096))
        engine = KVCopyEngine(layout, pool, coherence=coherence)  # type: ignore[arg-type]
        batch = [(b, [(b * layout.block_nbytes, layout.block_nbytes)]) for b in range(blocks)]
        nontemporal = coherence == "flush"

        def contiguous() -> None:
            native.copy(pool, 0, source, 0, total, nontemporal)

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

        results = {}
        for name, fn in (("contiguous", contiguous), ("per_piece", per_piece), ("save", save), ("load", load)):
            fn()  # warm
            seconds = _best(fn, repeat)
            results[name] = {"seconds": seconds, "gb_per_s": total / seconds / 1e9}
        # Correctness in the same run: what load put back equals what save took.
        check_ok = _round_trip_ok(engine, layout, blocks)
        pool.close()
        source.close()
    for buf in layers:
        buf.close()
    limit = results["contiguous"]["gb_per_s"]
    for r in results.values():
        r["vs_contiguous"] = r["gb_per_s"] / limit
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
