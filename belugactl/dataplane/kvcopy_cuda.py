"""The GPU path of the KV copy engine: a batch of block pieces moved with ONE Triton kernel.

The pool mapping (devdax mmap) is registered with CUDA (`cudaHostRegister`, portable + mapped), so
with unified virtual addressing the GPU reads and writes it directly at its host addresses: a save is
one kernel storing every piece of every block of the batch from the paged KV tensors into the pool
extents, a load the reverse, instead of one cudaMemcpy per 32 KiB piece. Plans come from the same
`KVBlockLayout` / `plan_copies` as the CPU path.

Imported only where a GPU is used (torch and triton are imported here, never by the CPU path).
Not exercised in CI; `scripts/gpu-check` runs `bench kv --device cuda` and the `gpu` tests.
"""

from __future__ import annotations

import statistics
import time
from array import array
from typing import Any

import torch

from belugactl.dataplane.kvcopy import Coherence, Extent, KVBlockLayout, buffer_address, plan_copies

CUDA_HOST_REGISTER_PORTABLE = 1
CUDA_HOST_REGISTER_MAPPED = 2
WORD = 16  # bytes per element the kernel moves; pieces and extents are multiples of it
CHUNK = 1024  # elements per program

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_pieces_kernel(src_ptr, dst_ptr, len_ptr, CHUNK_: tl.constexpr):  # noqa: N803 - triton style
        piece = tl.program_id(0)
        chunk = tl.program_id(1)
        n = tl.load(len_ptr + piece)  # in WORD units
        start = chunk * CHUNK_
        if start < n:
            src = tl.cast(tl.load(src_ptr + piece), tl.pointer_type(tl.int64))
            dst = tl.cast(tl.load(dst_ptr + piece), tl.pointer_type(tl.int64))
            offs = start + tl.arange(0, CHUNK_)
            mask = offs < n
            # two int64 per 16-byte word
            lo = tl.load(src + 2 * offs, mask=mask)
            hi = tl.load(src + 2 * offs + 1, mask=mask)
            tl.store(dst + 2 * offs, lo, mask=mask)
            tl.store(dst + 2 * offs + 1, hi, mask=mask)

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the GPU host's packages
    HAVE_TRITON = False


def register_host_memory(address: int, size: int) -> None:
    rc = torch.cuda.cudart().cudaHostRegister(address, size, CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_MAPPED)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister of the pool mapping failed: {rc}")


def unregister_host_memory(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


class CudaKVCopyEngine:
    """Save/load batches of blocks between CUDA paged KV tensors and the (registered) pool mapping."""

    def __init__(self, layout: KVBlockLayout, pool: Any, *, coherence: Coherence = "none") -> None:
        if not layout.device.startswith("cuda"):
            raise ValueError(f"CudaKVCopyEngine copies CUDA tensors; these live on {layout.device}")
        if not HAVE_TRITON:
            from belugactl.errors import EnvironmentProblem

            raise EnvironmentProblem(
                "the GPU KV copy path needs triton", fix="pip install triton (vLLM's CUDA builds include it)"
            )
        self.layout = layout
        self.pool = pool
        self.pool_base = buffer_address(pool)
        self.pool_size = len(memoryview(pool).cast("B"))
        self.coherence = coherence
        self.device = torch.device("cuda", torch.cuda.current_device())
        register_host_memory(self.pool_base, self.pool_size)
        self.tensor_base = layout.span()[0]
        for seg in layout.segments:
            if seg.length % WORD or (seg.base - self.tensor_base) % WORD or seg.block_stride % WORD:
                raise ValueError(f"{seg.name}: pieces must be {WORD}-byte multiples for the batched kernel")

    def close(self) -> None:
        unregister_host_memory(self.pool_base)

    def synchronize(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()

    def _launch(self, pieces: array, *, to_pool: bool) -> int:
        count = len(pieces) // 3
        if count == 0:
            return 0
        tensor_addr = [self.tensor_base + pieces[i] for i in range(0, len(pieces), 3)]
        pool_addr = [self.pool_base + pieces[i] for i in range(1, len(pieces), 3)]
        lengths = [pieces[i] for i in range(2, len(pieces), 3)]
        for addr in pool_addr:
            if addr % WORD:
                raise ValueError("pool extents must be 16-byte aligned for the batched kernel")
        src, dst = (tensor_addr, pool_addr) if to_pool else (pool_addr, tensor_addr)
        table = torch.tensor([src, dst, [n // WORD for n in lengths]], dtype=torch.int64).to(
            self.device, non_blocking=True
        )
        grid = (count, -(-max(lengths) // (WORD * CHUNK)))
        _copy_pieces_kernel[grid](table[0], table[1], table[2], CHUNK_=CHUNK)
        self.synchronize()  # commit (save) and lease release (load) must follow the bytes
        return sum(lengths)

    def save(self, blocks: list[tuple[int, list[Extent]]]) -> int:
        self._check(blocks)
        return self._launch(plan_copies(self.layout, blocks), to_pool=True)

    def load(self, blocks: list[tuple[int, list[Extent]]]) -> int:
        self._check(blocks)
        if self.coherence == "flush":
            from belugactl.dataplane import native

            # The GPU's reads snoop this host's caches: drop lines that may predate another host's write.
            for _, extents in blocks:
                for off, length in extents:
                    native.flush(self.pool, off, length, True)
        return self._launch(plan_copies(self.layout, blocks), to_pool=False)

    def _check(self, blocks: list[tuple[int, list[Extent]]]) -> None:
        for _, extents in blocks:
            for off, length in extents:
                if off < 0 or length < 0 or off + length > self.pool_size:
                    raise ValueError(f"extent ({off}, {length}) outside the pool of {self.pool_size} bytes")


def bench_cuda(*, blocks: int, repeat: int, layers: int, piece: int) -> dict[str, Any]:
    """`bench kv --device cuda`: the same comparison as on CPU, with GPU-resident paged tensors."""
    import mmap

    from belugactl.dataplane.kvcopy import TensorView

    if not torch.cuda.is_available():
        from belugactl.errors import EnvironmentProblem

        raise EnvironmentProblem("no CUDA device", fix="run bench kv --device cuda on a GPU host (scripts/gpu-check)")
    dev = torch.device("cuda", 0)
    per_layer = 2 * blocks * piece
    kv = torch.randint(0, 255, (layers, 2, blocks, piece), dtype=torch.uint8, device=dev)
    views = [
        TensorView(
            name=f"layer{i}",
            address=kv[i].data_ptr(),
            shape=(blocks, 2, piece),
            strides=(piece, blocks * piece, 1),
            itemsize=1,
            dtype="uint8",
            device="cuda",
        )
        for i in range(layers)
    ]
    layout = KVBlockLayout.from_views(views)
    total = blocks * layout.block_nbytes
    pool = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pool.write(bytes(total))
    engine = CudaKVCopyEngine(layout, pool)
    host = torch.frombuffer(pool, dtype=torch.uint8)
    flat = kv.view(-1)[:total]
    batch = [(b, [(b * layout.block_nbytes, layout.block_nbytes)]) for b in range(blocks)]
    segs = layout.segments
    pieces = [(seg.base - kv.data_ptr() + b * seg.block_stride, b * layout.block_nbytes + k * piece, piece)
              for b in range(blocks) for k, seg in enumerate(segs)]  # fmt: skip
    kv_flat = kv.view(-1)

    def contiguous() -> None:
        host.copy_(flat)
        torch.cuda.synchronize()

    def per_piece() -> None:
        for t, p, n in pieces:
            host[p : p + n].copy_(kv_flat[t : t + n], non_blocking=True)
        torch.cuda.synchronize()

    steps = {"contiguous": contiguous, "per_piece": per_piece, "save": lambda: engine.save(batch),
             "load": lambda: engine.load(batch)}  # fmt: skip
    for fn in steps.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeat):
        for name, fn in steps.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    results = {}
    for name, ts in samples.items():
        t = statistics.median(ts)
        results[name] = {"seconds": t, "gb_per_s": total / t / 1e9}
    for r in results.values():
        r["vs_contiguous"] = r["gb_per_s"] / results["contiguous"]["gb_per_s"]
    before = kv[0, 0, 0].clone()
    engine.save([(0, [(0, layout.block_nbytes)])])
    kv[0, 0, 0].fill_(7)
    engine.load([(0, [(0, layout.block_nbytes)])])
    ok = bool(torch.equal(kv[0, 0, 0], before))
    engine.close()
    return {
        "device": torch.cuda.get_device_name(dev),
        "triton": HAVE_TRITON,
        "shape": {"layers": layers, "piece_bytes": piece, "pieces_per_block": layout.pieces_per_block,
                  "block_bytes": layout.block_nbytes},  # fmt: skip
        "blocks": blocks,
        "bytes": total,
        "per_layer_bytes": per_layer,
        "results": results,
        "round_trip_ok": ok,
        "target": {"save_and_load_vs_contiguous": 0.8},
    }
