"""The native coherence helper, or pure-Python fallbacks that are honest about what they cannot do.

With the C extension (`_native`, built by setup.py with the machine's compiler) this module gives:
cache-line flush + fence (clwb / clflushopt / clflush, picked with cpuid at import), non-temporal
copies, 64-bit atomic load/store/CAS/fetch-add on mapped memory, bounded spin-waits, and a
gather/scatter copy of many pieces in one call.

Without it the same functions exist and work on ONE host (the CPU cache is coherent there), but
`flush` cannot flush and `cas64` is not atomic across processes. `require_coherence()` turns that
into a loud warning (or an error) wherever a pool is shared by several hosts. Set
BELUGACTL_NATIVE=0 to force the fallbacks (tests of the fallback path use it).
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

_native: Any = None
if os.environ.get("BELUGACTL_NATIVE", "1") != "0":
    try:
        from belugactl.dataplane import _native  # type: ignore[attr-defined,no-redef]
    except ImportError:  # not built: the fallbacks below take over
        _native = None

AVAILABLE: bool = _native is not None


def optional(name: str) -> Any:
    """The native helper's function `name`, or None where the helper is not built (callers then take
    their Python path)."""
    return getattr(_native, name, None)

_Q = struct.Struct("<Q")

MISSING_WHY = (
    "the C helper belugactl.dataplane._native is not built (no compiler at install time, or BELUGACTL_NATIVE=0)"
)
MISSING_FIX = (
    "install gcc and python3-dev, then `pip install -e .` again; or map the pool uncacheable (MTRR UC) "
    "so plain loads and stores are coherent; a single-host pool works without it"
)


def features() -> dict[str, object]:
    """CPU features seen by cpuid and the flush instruction in use; `native: False` without the helper."""
    if _native is None:
        return {"native": False, "flush": "none"}
    return {"native": True, **_native.features()}


_warned = False


def require_coherence(*, shared_by_hosts: bool, uncacheable: bool = False) -> str | None:
    """Say loudly (once, on stderr) when a multi-host pool would run without flushes. Returns the warning."""
    global _warned
    if AVAILABLE or not shared_by_hosts or uncacheable:
        return None
    text = (
        "WARNING: multi-host CXL pool without the native helper: no cache-line flushes or non-temporal stores, "
        f"so other hosts may read stale bytes. Why: {MISSING_WHY}. Fix: {MISSING_FIX}."
    )
    if not _warned:
        print(text, file=sys.stderr)
        _warned = True
    return text


# --- pure-Python fallbacks (single host only) ------------------------------------------------


def _check(buf: Any, off: int, n: int) -> None:
    if off < 0 or n < 0 or off + n > len(memoryview(buf).cast("B")):
        raise ValueError(f"range [{off}, +{n}) outside a buffer of {len(memoryview(buf).cast('B'))} bytes")


def _py_flush(buf: Any, off: int, n: int, for_read: bool = False) -> None:
    _check(buf, off, n)  # nothing to do: Python cannot flush a cache line


def _py_fence() -> None:
    return None


def _py_copy(dst: Any, dst_off: int, src: Any, src_off: int, n: int, nontemporal: bool = False) -> None:
    _check(dst, dst_off, n)
    _check(src, src_off, n)
    memoryview(dst).cast("B")[dst_off : dst_off + n] = memoryview(src).cast("B")[src_off : src_off + n]


def _py_gather(dst: Any, src: Any, pieces: Any, nontemporal: bool = False) -> int:
    d = memoryview(dst).cast("B")
    s = memoryview(src).cast("B")
    flat = list(memoryview(pieces).cast("B").cast("q")) if not isinstance(pieces, list | tuple) else None
    triples = [tuple(flat[i : i + 3]) for i in range(0, len(flat), 3)] if flat is not None else list(pieces)
    total = 0
    for so, do, n in triples:
        if so < 0 or do < 0 or n < 0 or so + n > len(s) or do + n > len(d):
            raise ValueError(f"piece ({so}, {do}, {n}) is outside the buffers")
    for so, do, n in triples:
        d[do : do + n] = s[so : so + n]
        total += n
    return total


def _py_gather_blocks(
    pool: Any, tensors: Any, template: Any, blocks: Any, save: bool, nontemporal: bool = False
) -> int:
    tpl = list(memoryview(template).cast("B").cast("q"))
    blk = list(memoryview(blocks).cast("B").cast("q"))
    if len(tpl) % 3 or len(blk) % 2:
        raise ValueError("template must be int64 triples and blocks int64 pairs")
    segs = [tuple(tpl[i : i + 3]) for i in range(0, len(tpl), 3)]
    if any(x < 0 for seg in segs for x in seg):
        raise ValueError("a template piece is negative")
    pool_n = len(memoryview(pool).cast("B"))
    ten_n = len(memoryview(tensors).cast("B"))
    need = sum(n for _, _, n in segs)
    triples: list[tuple[int, int, int]] = []  # (tensor offset, pool offset, n)
    for i in range(0, len(blk), 2):
        block_id, pool_off = blk[i], blk[i + 1]
        if block_id < 0 or pool_off < 0 or pool_off + need > pool_n:
            raise ValueError(f"block {block_id} at pool offset {pool_off} ({need} bytes) is outside the pool")
        for k, (rel, stride, n) in enumerate(segs):
            t = rel + block_id * stride
            if t + n > ten_n:
                raise ValueError(f"block {block_id} piece {k} is outside the tensors ({ten_n} bytes)")
            triples.append((t, pool_off, n))
            pool_off += n
    if save:
        return _py_gather(pool, tensors, triples, nontemporal)
    return _py_gather(tensors, pool, [(p, t, n) for t, p, n in triples], nontemporal)


def _word(buf: Any, off: int) -> None:
    # struct would accept a negative offset (counted from the end): refuse it like the C helper.
    if off < 0 or off + 8 > memoryview(buf).nbytes:
        raise ValueError(f"word offset {off} outside a buffer of {memoryview(buf).nbytes} bytes")


def _py_load64(buf: Any, off: int) -> int:
    _word(buf, off)
    return _Q.unpack_from(buf, off)[0]


def _py_store64(buf: Any, off: int, value: int, flush: bool = False) -> None:
    _word(buf, off)
    _Q.pack_into(buf, off, value)


def _py_cas64(buf: Any, off: int, expected: int, desired: int) -> int:
    # Not atomic across processes: only safe with one writer, which is all a single host without
    # the helper is promised.
    _word(buf, off)
    seen = _Q.unpack_from(buf, off)[0]
    if seen == expected:
        _Q.pack_into(buf, off, desired)
    return seen


def _py_fetch_add64(buf: Any, off: int, add: int) -> int:
    _word(buf, off)
    old = _Q.unpack_from(buf, off)[0]
    _Q.pack_into(buf, off, (old + add) & 0xFFFFFFFFFFFFFFFF)
    return old


def _py_wait64(buf: Any, off: int, value: int, timeout_ns: int, flush: bool = False) -> int:
    _word(buf, off)
    deadline = time.perf_counter_ns() + timeout_ns
    unpack = _Q.unpack_from
    while True:
        x = unpack(buf, off)[0]
        if x == value or time.perf_counter_ns() >= deadline:
            return x


def _py_wait_any(buf: Any, offsets: Any, value: int, timeout_ns: int, flush: bool = False) -> int:
    return _py_wait_words(buf, offsets, value, timeout_ns, 0, -1)


def _py_idle_wait_any(
    buf: Any, offsets: Any, value: int, timeout_ns: int, sleep_ns: int, flush: bool = False, fd: int = -1
) -> int:
    if not 0 < sleep_ns <= 1_000_000_000:
        raise ValueError("sleep_ns must be in (0, 1 s]")
    return _py_wait_words(buf, offsets, value, timeout_ns, sleep_ns, fd)


def _py_wait_words(buf: Any, offsets: Any, value: int, timeout_ns: int, sleep_ns: int, fd: int) -> int:
    """The index of the first word at `offsets` equal to `value`, -1 after `timeout_ns`, -2 when `fd`
    (not -1) is readable; between looks, a spin (`sleep_ns` 0) or a sleep (in select, on `fd`)."""
    offs = list(memoryview(offsets).cast("B").cast("q"))
    for off in offs:
        _word(buf, off)
    deadline = time.perf_counter_ns() + timeout_ns
    unpack = _Q.unpack_from
    while True:
        for i, off in enumerate(offs):
            if unpack(buf, off)[0] == value:
                return i
        if time.perf_counter_ns() >= deadline:
            return -1
        if not sleep_ns:
            continue
        if fd < 0:
            time.sleep(sleep_ns / 1e9)
        elif select.select([fd], [], [], sleep_ns / 1e9)[0]:
            return -2


# --- CRC32C (Castagnoli): checksums of KV blocks (docs/dataplane.md, "Checksums") -------------
# The fallback is a byte-at-a-time table in Python: correct and slow, fine for tests and small
# pools; the helper's SSE4.2 kernel is orders of magnitude faster. If the PyPI `crc32c` package
# happens to be installed it is used instead (same polynomial and chaining).
_CRC_POLY = 0x82F63B78
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _CRC_POLY if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)
del _i, _c

try:  # an optional accelerator for the fallback, used only when already installed
    import crc32c as _crc32c_pkg  # type: ignore[import-not-found]
except ImportError:
    _crc32c_pkg = None


def _py_crc32c(buf: Any, off: int = 0, n: int = -1, crc: int = 0) -> int:
    mv = memoryview(buf).cast("B")
    if n == -1:
        n = len(mv) - off
    _check(buf, off, n)
    if not 0 <= crc <= 0xFFFFFFFF:
        raise ValueError("crc must be a 32-bit value")
    if _crc32c_pkg is not None:
        return _crc32c_pkg.crc32c(bytes(mv[off : off + n]), crc)
    c = crc ^ 0xFFFFFFFF
    table = _CRC_TABLE
    for b in bytes(mv[off : off + n]):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _py_copy_crc32c(
    dst: Any, dst_off: int, src: Any, src_off: int, n: int, crc: int = 0, nontemporal: bool = False
) -> int:
    _check(dst, dst_off, n)
    _check(src, src_off, n)
    data = bytes(memoryview(src).cast("B")[src_off : src_off + n])
    memoryview(dst).cast("B")[dst_off : dst_off + n] = data
    return _py_crc32c(data, 0, n, crc)


def _py_gather_blocks_crc32c(
    pool: Any, tensors: Any, template: Any, blocks: Any, save: bool, nontemporal: bool = False
) -> list[int]:
    _py_gather_blocks(pool, tensors, template, blocks, save, nontemporal)
    tpl = list(memoryview(template).cast("B").cast("q"))
    blk = list(memoryview(blocks).cast("B").cast("q"))
    need = sum(tpl[i + 2] for i in range(0, len(tpl), 3))
    if save:
        return [_py_crc32c(pool, blk[i + 1], need) for i in range(0, len(blk), 2)]
    out = []
    for i in range(0, len(blk), 2):  # the bytes as they landed in the tensors, in pool order
        crc = 0
        for k in range(0, len(tpl), 3):
            crc = _py_crc32c(tensors, tpl[k] + blk[i] * tpl[k + 1], tpl[k + 2], crc)
        out.append(crc)
    return out


if _native is not None:
    flush = _native.flush
    fence = _native.fence
    copy = _native.copy
    load64 = _native.load64
    store64 = _native.store64
    cas64 = _native.cas64
    fetch_add64 = _native.fetch_add64
    wait64 = _native.wait64
    wait_any = _native.wait_any
    idle_wait_any = _native.idle_wait_any
    _gather = _native.gather
    _gather_blocks = _native.gather_blocks
    fi_new = getattr(_native, "fi_new", None)
    fi_put = getattr(_native, "fi_put", None)
    fi_del = getattr(_native, "fi_del", None)
    fi_put_entries = getattr(_native, "fi_put_entries", None)
    fast_serve = getattr(_native, "fast_serve", None)
    journal_replay = getattr(_native, "journal_replay", None)
    journal_copy = getattr(_native, "journal_copy", None)
    crc32c = _native.crc32c
    copy_crc32c = _native.copy_crc32c
    _gather_blocks_crc32c = _native.gather_blocks_crc32c
    CRC32C_KERNEL: str = _native.crc32c_kernel()
else:
    flush = _py_flush
    fence = _py_fence
    copy = _py_copy
    load64 = _py_load64
    store64 = _py_store64
    cas64 = _py_cas64
    fetch_add64 = _py_fetch_add64
    wait64 = _py_wait64
    wait_any = _py_wait_any
    idle_wait_any = _py_idle_wait_any
    _gather = _py_gather
    _gather_blocks = _py_gather_blocks
    # The metadata server's native lookup fast path has no Python twin: the server's own Python
    # loop is the fallback.
    fi_new = fi_put = fi_del = fi_put_entries = fast_serve = None
    # The journal's replay has its Python twin in mds/journal.py (replay, rewrite).
    journal_replay = journal_copy = None
    crc32c = _py_crc32c
    copy_crc32c = _py_copy_crc32c
    _gather_blocks_crc32c = _py_gather_blocks_crc32c
    CRC32C_KERNEL = "python-crc32c-package" if _crc32c_pkg is not None else "python-table"


def gather(dst: Any, src: Any, pieces: Any, *, nontemporal: bool = False) -> int:
    """Copy many pieces in one call; returns the bytes copied.

    `pieces` is a buffer of int64 (src_off, dst_off, len) triples (array('q'), a numpy int64 array
    of shape (n, 3)), or a sequence of 3-tuples. Offsets are checked against both buffers before
    anything is copied. With `nontemporal`, destination writes bypass the cache (publishing to a
    non-coherent pool); ends with a store fence.
    """
    if isinstance(pieces, Sequence) and not isinstance(pieces, bytes | bytearray | memoryview):
        from array import array

        flat = array("q")
        for t in pieces:
            flat.extend(t)
        pieces = flat
    return _gather(dst, src, pieces, nontemporal)


def gather_blocks(pool: Any, tensors: Any, template: Any, blocks: Any, *, save: bool, nontemporal: bool = False) -> int:
    """Copy whole KV blocks between paged tensors and the pool in one call; returns the bytes copied.

    `template` holds int64 triples, one per piece of a block, in pool order: (offset of block 0's
    piece in `tensors`, bytes from one block's piece to the next block's, length). `blocks` holds
    int64 pairs (block id, pool offset); a block's pieces lie back to back in the pool from there.
    `save` copies tensors -> pool, else pool -> tensors. The helper plans the pieces itself (no
    per-piece Python), checks every one against both buffers before any byte moves, and copies
    pieces that continue each other as one; `nontemporal` as for `gather`.
    """
    return _gather_blocks(pool, tensors, template, blocks, save, nontemporal)


def gather_blocks_crc32c(
    pool: Any, tensors: Any, template: Any, blocks: Any, *, save: bool, nontemporal: bool = False
) -> list[int]:
    """`gather_blocks` that also returns each block's CRC32C (its bytes in pool order), computed
    from the words as they are copied (one pass, not two): on save, of what was stored; on load,
    of what landed in the tensors, so a load can be checked against its writer's checksum."""
    return _gather_blocks_crc32c(pool, tensors, template, blocks, save, nontemporal)


# load_blocks_checked(pool, tensors, template, blocks, expected, nontemporal, release, deadline)
#   -> (indices of blocks whose CRC32C differs from `expected`, rpc_release_nowait's result or None, release ns)
# The one-call load: a CPU load, its checksum check and its no-wait lease release (see _native_load.c):
# None without the helper, and then the caller copies, checks and releases as separate steps.
load_blocks_checked: Any = getattr(_native, "load_blocks_checked", None) if _native is not None else None


def extents_crc32c(buf: Any, extents: Sequence[tuple[int, int]], nbytes: int) -> int:
    """CRC32C of the first `nbytes` bytes laid out across `extents` (pool offset, length), in order."""
    crc = 0
    left = nbytes
    for off, length in extents:
        if left <= 0:
            break
        take = min(length, left)
        crc = crc32c(buf, off, take, crc)
        left -= take
    if left > 0:
        raise ValueError(f"extents hold fewer than {nbytes} bytes")
    return crc
