"""The KV copy engine: moves whole KV blocks between paged KV tensors and extents of the pool.

A vLLM KV block is not one piece of memory: every attention layer keeps its own paged tensor, and a
block's bytes are one piece per layer (CPU backend: K and V interleaved in one piece) or two (GPU
backends: K and V apart). Qwen-32B with 16-token blocks has 64 layers x (K, V) = 128 pieces of
32 KiB. In the pool a block is stored as the concatenation of its pieces, in a fixed layer order, over
the extents the metadata server reserved for it (one or several).

What this module does, in order:
1. `KVBlockLayout.from_tensors(...)` derives, from the tensors alone (address, shape, strides), where
   block b's pieces are: `base + b * block_stride`, `length` bytes, per segment. No knowledge of a
   backend's shape convention is needed beyond "blocks are dimension 0" (vLLM's standardized per-layer
   view); dimensions whose stride is wider than a block's (K/V outside the block) become more segments.
2. `plan_copies(...)` turns a batch of blocks and their pool extents into a flat list of
   (tensor address, pool address, length) pieces, split at extent boundaries and coalesced where
   neighbouring blocks are neighbours in both places, so a batch is few, large copies.
3. `KVCopyEngine.save/load` runs a batch as ONE native call. When each block sits in one extent
   (the common case) that is `native.gather_blocks`: the engine hands it the layout's piece template
   (built once) and (block id, pool offset) pairs, and the helper plans, bounds-checks, coalesces and
   copies the pieces itself; planning every piece of every block in Python had cost a large share
   of the copy time. Blocks split over extents go through `plan_copies` and `native.gather`. Batches
   of `NONTEMPORAL_FROM` bytes or more (and every save with `coherence: flush`) use non-temporal stores; a flush of the
   extents precedes a load with `flush`. Without the helper its stand-ins copy and the data plane
   warns that cross-host coherence is not handled. The CUDA path (`kvcopy_cuda`) is imported lazily.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Coherence = Literal["none", "flush"]
"""none: plain copies (one host, or the pool is mapped uncachable); flush: non-temporal writes and a
flush of the source lines before reads (write-back pool shared by several hosts, CXL 2.0)."""

Extent = tuple[int, int]  # (pool offset, length)

# From this many bytes per batch on, stores bypass the cache (as glibc's memcpy does for large copies):
# skipping the read-for-ownership of every destination line pays once the batch no longer fits in the
# caches; below it, plain stores keep the batch in the CPU caches and are faster. The threshold is
# where the two crossed in `belugactl bench kv` (workflows/bench/kv_copy.run_cpu). Saves with
# `coherence: flush` always stream (that is what publishes them).
NONTEMPORAL_FROM = 32 << 20


@dataclass(frozen=True)
class Segment:
    """Where one piece of every block lives in one paged tensor."""

    name: str  # layer name plus the index of an outer dimension ("model.layers.0.attn[1]" for V)
    base: int  # absolute address of block 0's piece
    block_stride: int  # bytes from block b's piece to block b+1's
    length: int  # bytes of one block's piece (contiguous)
    layer: str = ""  # the paged tensor (vLLM layer name) the piece belongs to


@dataclass(frozen=True)
class TensorView:
    """The facts the engine needs about one paged tensor, whichever library holds it."""

    name: str
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in bytes
    itemsize: int
    dtype: str
    device: str = "cpu"

    @classmethod
    def of(cls, name: str, tensor: Any) -> TensorView:
        """From a torch.Tensor (duck-typed, so torch is not imported here) or a buffer + shape."""
        if hasattr(tensor, "data_ptr") and hasattr(tensor, "stride"):
            itemsize = int(tensor.element_size())
            return cls(
                name=name,
                address=int(tensor.data_ptr()),
                shape=tuple(int(x) for x in tensor.shape),
                strides=tuple(int(s) * itemsize for s in tensor.stride()),
                itemsize=itemsize,
                dtype=str(tensor.dtype).removeprefix("torch."),
                device=str(tensor.device.type),
            )
        raise TypeError(f"{name}: cannot take the layout of a {type(tensor).__name__}")


def buffer_address(buf: Any) -> int:
    """Address of the first byte of a writable buffer (mmap, bytearray, writable memoryview)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def contiguous_view(name: str, buf: Any, shape: Sequence[int], itemsize: int, dtype: str = "bfloat16") -> TensorView:
    """A C-contiguous tensor of `shape` laid over a writable buffer (benchmarks, tests)."""
    strides: list[int] = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    need = step
    if len(memoryview(buf).cast("B")) < need:
        raise ValueError(f"{name}: buffer of {len(memoryview(buf))} bytes is smaller than {need}")
    return TensorView(name, buffer_address(buf), tuple(shape), tuple(reversed(strides)), itemsize, dtype)


def _segments_of(view: TensorView) -> list[Segment]:
    if not view.shape:
        raise ValueError(f"{view.name}: a paged KV tensor has a block dimension")
    block_stride = view.strides[0]
    outer = [d for d in range(1, len(view.shape)) if view.strides[d] > block_stride]
    inner = [d for d in range(1, len(view.shape)) if d not in outer]
    length = view.itemsize + sum((view.shape[d] - 1) * view.strides[d] for d in inner)
    span = 1
    for d in inner:
        span *= view.shape[d]
    if length != span * view.itemsize:
        # A piece with holes (padding inside a block) would copy garbage or miss bytes.
        raise ValueError(f"{view.name}: a block's piece is not contiguous (shape {view.shape}, strides {view.strides})")
    segments: list[Segment] = []
    combos: list[tuple[int, ...]] = [()]
    for d in outer:
        combos = [c + (i,) for c in combos for i in range(view.shape[d])]
    for combo in combos:
        offset = sum(i * view.strides[d] for i, d in zip(combo, outer, strict=True))
        label = view.name + "".join(f"[{i}]" for i in combo)
        segments.append(Segment(label, view.address + offset, block_stride, length, view.name))
    return segments


@dataclass(frozen=True)
class LayerSpan:
    """One layer's pieces of a block: segments [first, first + count), at `offset` bytes into the
    block as stored in the pool, `nbytes` long."""

    layer: str
    first: int
    count: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class LayerCopy:
    """One layer of a batch, ready for the native helper: its pieces' template and the batch's
    (block id, pool offset of the layer's first piece) pairs."""

    layer: str
    template: array
    pairs: array


@dataclass(frozen=True)
class KVBlockLayout:
    """How one KV block's bytes are spread over the paged tensors, and how it is packed in the pool."""

    segments: tuple[Segment, ...]
    num_blocks: int
    device: str
    dtype: str

    @classmethod
    def from_views(cls, views: Iterable[TensorView]) -> KVBlockLayout:
        views = list(views)
        if not views:
            raise ValueError("no KV tensors to copy from")
        num_blocks = min(v.shape[0] for v in views)
        segments: list[Segment] = []
        seen: set[tuple[int, int]] = set()
        for view in views:
            for seg in _segments_of(view):
                # Layers that share storage (packed layouts) would otherwise be stored twice.
                if (seg.base, seg.length) in seen:
                    continue
                seen.add((seg.base, seg.length))
                segments.append(seg)
        devices = {v.device for v in views}
        dtypes = {v.dtype for v in views}
        return cls(tuple(segments), num_blocks, ",".join(sorted(devices)), ",".join(sorted(dtypes)))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any]) -> KVBlockLayout:
        """From vLLM's `register_kv_caches` dict (layer name -> paged tensor), in the dict's layer order."""
        return cls.from_views(TensorView.of(name, t) for name, t in tensors.items())

    def span(self) -> tuple[int, int]:
        """The lowest and highest address any block piece can touch."""
        lo = min(s.base for s in self.segments)
        hi = max(s.base + (self.num_blocks - 1) * s.block_stride + s.length for s in self.segments)
        return lo, hi

    @property
    def block_nbytes(self) -> int:
        return sum(s.length for s in self.segments)

    def layer_spans(self) -> tuple[LayerSpan, ...]:
        """Each layer's run of pieces, in pool order: a layer-wise load copies one span at a time.

        A layer whose tensor shares storage with an earlier one has no pieces of its own (they were
        stored once), so it has no span; callers wait for every span before such a layer runs."""
        spans: list[LayerSpan] = []
        offset = 0
        for i, seg in enumerate(self.segments):
            if spans and spans[-1].layer == seg.layer and spans[-1].first + spans[-1].count == i:
                last = spans[-1]
                spans[-1] = LayerSpan(last.layer, last.first, last.count + 1, last.offset, last.nbytes + seg.length)
            else:
                spans.append(LayerSpan(seg.layer, i, 1, offset, seg.length))
            offset += seg.length
        return tuple(spans)

    @property
    def pieces_per_block(self) -> int:
        return len(self.segments)

    def signature(self) -> dict[str, object]:
        """What two instances must agree on to exchange blocks (no addresses): part of the namespace."""
        return {
            "pieces": [s.length for s in self.segments],
            "block_nbytes": self.block_nbytes,
            "dtype": self.dtype,
        }


def plan_copies(layout: KVBlockLayout, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> array:
    """Flat int64 triples (tensor offset, pool offset, length) for a batch of blocks, coalesced.

    Tensor offsets are relative to `layout.span()[0]`. `blocks` is [(block id, extents)], the extents
    together at least `layout.block_nbytes` long; block bytes fill them in order. Raises ValueError on
    a block id outside the tensors or extents too short: extents come from another process, and a
    wrong length must not become a wild copy.
    """
    out = array("q")
    need = layout.block_nbytes
    lo = layout.span()[0]
    rel = [seg.base - lo for seg in layout.segments]
    strides = [seg.block_stride for seg in layout.segments]
    lengths = array("q", [seg.length for seg in layout.segments])
    in_block = []
    acc = 0
    for seg in layout.segments:
        in_block.append(acc)
        acc += seg.length
    count = len(rel)
    for block_id, extents in blocks:
        if not 0 <= block_id < layout.num_blocks:
            raise ValueError(f"block id {block_id} outside 0..{layout.num_blocks - 1}")
        total = sum(length for _, length in extents)
        if total < need:
            raise ValueError(f"block {block_id}: extents hold {total} bytes, a block needs {need}")
        if len(extents) == 1 or extents[0][1] >= need:
            # The common case, one extent: the block's pieces follow each other in it. Built with
            # list arithmetic, not a per-piece loop (this runs for every 128-piece block).
            ext_off = extents[0][0]
            triples = array("q", bytes(24 * count))
            triples[0::3] = array("q", [r + block_id * st for r, st in zip(rel, strides, strict=True)])
            triples[1::3] = array("q", [ext_off + o for o in in_block])
            triples[2::3] = lengths
            if count == 1:
                _append_coalesced(out, triples[0], triples[1], triples[2])
            else:
                out.extend(triples)
            continue
        ext_iter = iter(extents)
        ext_off, ext_left = next(ext_iter)
        for seg in layout.segments:
            src = seg.base - lo + block_id * seg.block_stride
            left = seg.length
            while left:
                while ext_left == 0:
                    ext_off, ext_left = next(ext_iter)
                n = min(left, ext_left)
                _append_coalesced(out, src, ext_off, n)
                src += n
                ext_off += n
                ext_left -= n
                left -= n
    return out


def _append_coalesced(out: array, tensor_off: int, pool_off: int, length: int) -> None:
    if out:
        t, p, n = out[-3], out[-2], out[-1]
        if t + n == tensor_off and p + n == pool_off:
            out[-1] = n + length
            return
    out.extend((tensor_off, pool_off, length))


def _swap_pairs(pieces: array) -> array:
    """(tensor, pool, n) -> (pool, tensor, n): the helper reads (src, dst, n)."""
    swapped = array("q", pieces)
    swapped[0::3] = pieces[1::3]
    swapped[1::3] = pieces[0::3]
    return swapped


class KVCopyEngine:
    """Save (tensors -> pool) and load (pool -> tensors) batches of blocks on the CPU.

    `pool` is the pool mapping's writable buffer (mmap or memoryview); `coherence` says whether
    writes must bypass the cache and reads must flush first (see `Coherence`). Each batch is ONE
    call of the data plane's native helper (`gather_blocks`, or `gather` for blocks split over
    extents; GIL released); without the helper, the same call runs its pure-Python stand-in.
    """

    def __init__(self, layout: KVBlockLayout, pool: Any, *, coherence: Coherence = "none") -> None:
        if layout.device != "cpu":
            raise ValueError(f"KVCopyEngine copies CPU tensors; these live on {layout.device} (use kvcopy_cuda)")
        from belugactl.dataplane import native

        self.native = native
        self.layout = layout
        self.pool = pool
        self.pool_size = len(memoryview(pool).cast("B"))
        lo, hi = layout.span()
        # One buffer object over the address range of all the tensors, so a batch spanning every
        # layer is a single gather call. Only the planned pieces are ever touched.
        self.tensors = (ctypes.c_char * (hi - lo)).from_address(lo)
        # Where every piece of a block is, once per layout: (offset of block 0's piece from `lo`,
        # block stride, length), in pool order. The native helper derives each batch's pieces from
        # it, so a batch costs no per-piece Python.
        self.template = array("q")
        for seg in layout.segments:
            self.template.extend((seg.base - lo, seg.block_stride, seg.length))
        self.layer_spans = layout.layer_spans()
        self.coherence = coherence
        if coherence == "flush":
            native.require_coherence(shared_by_hosts=True)

    def block_pairs(self, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> array | None:
        """Check a batch (extents inside the pool, block ids inside the tensors, extents long enough)
        and return it as int64 (block id, pool offset) pairs for the native planner, or None when a
        block is split over several extents (then the batch goes through `plan_copies`). Public for
        callers that hand the pairs to a native call of their own (the vLLM worker's one-call load)."""
        need = self.layout.block_nbytes
        num_blocks = self.layout.num_blocks
        size = self.pool_size
        pairs = array("q")
        whole = True
        for block_id, extents in blocks:
            total = 0
            for off, length in extents:
                if off < 0 or length < 0 or off + length > size:
                    raise ValueError(f"extent ({off}, {length}) outside the pool of {size} bytes")
                total += length
            if not 0 <= block_id < num_blocks:
                raise ValueError(f"block id {block_id} outside 0..{num_blocks - 1}")
            if total < need:
                raise ValueError(f"block {block_id}: extents hold {total} bytes, a block needs {need}")
            if whole and extents[0][1] >= need:
                pairs.append(block_id)
                pairs.append(extents[0][0])
            else:
                whole = False
        return pairs if whole else None

    def nontemporal_for(self, blocks: Sequence[object]) -> bool:
        """Whether a batch of this many blocks is copied with non-temporal stores (`NONTEMPORAL_FROM`)."""
        return len(blocks) * self.layout.block_nbytes >= NONTEMPORAL_FROM

    def save(self, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> int:
        """Gather each block's pieces from the tensors into its extents. Returns bytes written."""
        pairs = self.block_pairs(blocks)
        # On a shared write-back pool non-temporal stores are what publishes the bytes to other hosts.
        nontemporal = self.coherence == "flush" or self.nontemporal_for(blocks)
        if pairs is not None:
            return self.native.gather_blocks(
                self.pool, self.tensors, self.template, pairs, save=True, nontemporal=nontemporal
            )
        pieces = plan_copies(self.layout, blocks)
        return self.native.gather(self.pool, self.tensors, memoryview(pieces), nontemporal=nontemporal)

    def layer_plan(self, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> list[LayerCopy] | None:
        """A batch split by layer, for loads that overlap the forward pass (each layer copied as
        one native call, in model order). The batch is checked as for `load` (ValueError on a bad
        extent or block id); None when a block is split over several extents (load it whole)."""
        pairs = self.block_pairs(blocks)
        if pairs is None:
            return None
        plan: list[LayerCopy] = []
        for span in self.layer_spans:
            shifted = array("q", pairs)
            if span.offset:
                shifted[1::2] = array("q", [off + span.offset for off in pairs[1::2]])
            template = self.template[3 * span.first : 3 * (span.first + span.count)]
            plan.append(LayerCopy(span.layer, template, shifted))
        return plan

    def copy_layer(self, layer: LayerCopy, *, nontemporal: bool = False) -> int:
        """Load one layer of a planned batch (pool -> tensors). Returns bytes copied."""
        return self.native.gather_blocks(
            self.pool, self.tensors, layer.template, layer.pairs, save=False, nontemporal=nontemporal
        )

    def flush_extents(self, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> None:
        """Drop cached copies of the batch's pool lines before reading them (`coherence: flush`)."""
        if self.coherence != "flush":
            return
        for _, extents in blocks:
            for off, length in extents:
                self.native.flush(self.pool, off, length, True)

    def load(self, blocks: Sequence[tuple[int, Sequence[Extent]]]) -> int:
        """Scatter each block's bytes from its extents into the tensors. Returns bytes read."""
        pairs = self.block_pairs(blocks)
        if self.coherence == "flush":
            # Another host wrote these lines with non-temporal stores; drop any stale copy we cache.
            for _, extents in blocks:
                for off, length in extents:
                    self.native.flush(self.pool, off, length, True)
        nontemporal = self.nontemporal_for(blocks)
        if pairs is not None:
            return self.native.gather_blocks(
                self.pool, self.tensors, self.template, pairs, save=False, nontemporal=nontemporal
            )
        pieces = _swap_pairs(plan_copies(self.layout, blocks))
        return self.native.gather(self.tensors, self.pool, memoryview(pieces), nontemporal=nontemporal)
