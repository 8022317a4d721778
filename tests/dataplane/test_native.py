"""The native helper and its pure-Python fallbacks must agree; offsets outside the buffer never touch memory."""

from __future__ import annotations

import mmap
from array import array

import pytest

from belugactl.dataplane import native
from tests.dataplane.conftest import native_param

IMPLS = [
    pytest.param(
        {
            "load64": native._py_load64,
            "store64": native._py_store64,
            "cas64": native._py_cas64,
            "fetch_add64": native._py_fetch_add64,
            "wait64": native._py_wait64,
            "flush": native._py_flush,
            "copy": native._py_copy,
            "gather": native._py_gather,
        },
        id="python",
    )
]
IMPLS.append(native_param())


@pytest.fixture
def shared() -> mmap.mmap:
    m = mmap.mmap(-1, 1 << 16)
    yield m
    m.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_atomics(impl, shared) -> None:
    impl["store64"](shared, 64, 41)
    assert impl["load64"](shared, 64) == 41
    assert impl["fetch_add64"](shared, 64, 1) == 41
    assert impl["cas64"](shared, 64, 7, 99) == 42  # fails: returns what it saw
    assert impl["load64"](shared, 64) == 42
    assert impl["cas64"](shared, 64, 42, 2**64 - 1) == 42
    assert impl["load64"](shared, 64) == 2**64 - 1


@pytest.mark.parametrize("impl", IMPLS)
def test_wait_returns_on_match_or_after_timeout(impl, shared) -> None:
    impl["store64"](shared, 0, 5)
    assert impl["wait64"](shared, 0, 5, 10_000_000) == 5
    assert impl["wait64"](shared, 0, 6, 2_000_000) == 5  # times out, reports what it saw


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_is_refused(impl, shared) -> None:
    size = len(shared)
    for bad in (-8, size - 4, size):
        with pytest.raises(ValueError):
            impl["load64"](shared, bad)
    with pytest.raises(ValueError):
        impl["flush"](shared, size - 10, 64)
    with pytest.raises(ValueError):
        impl["copy"](shared, size - 10, b"x" * 64, 0, 64, False)
    with pytest.raises(ValueError):
        impl["gather"](shared, bytearray(100), array("q", [0, size - 1, 2]), False)


@pytest.mark.native
def test_native_rejects_unaligned_words(shared) -> None:
    with pytest.raises(ValueError):
        native._native.load64(shared, 4)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("nontemporal", [False, True])
def test_copy_and_gather_move_the_right_bytes(impl, shared, nontemporal) -> None:
    src = bytes(range(256)) * 40
    impl["copy"](shared, 3, src, 5, 3000, nontemporal)
    assert shared[3:3003] == src[5:3005]
    dst = bytearray(4096)
    pieces = array("q", [0, 100, 10, 500, 0, 64, 1000, 2000, 777])
    assert impl["gather"](dst, src, pieces, nontemporal) == 10 + 64 + 777
    assert dst[100:110] == src[0:10] and dst[0:64] == src[500:564] and dst[2000:2777] == src[1000:1777]


def test_gather_accepts_tuples_and_features_are_reported() -> None:
    dst = bytearray(16)
    assert native.gather(dst, b"abcdefgh", [(0, 8, 4), (4, 0, 4)]) == 8
    assert dst[:4] == b"efgh" and dst[8:12] == b"abcd"
    feats = native.features()
    assert feats["native"] is native.AVAILABLE
    if native.AVAILABLE:
        assert feats["flush"] in {"clwb", "clflushopt", "clflush", "none"}


def test_missing_helper_warns_loudly_only_for_multi_host(monkeypatch, capsys) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(native, "_warned", False)
    assert native.require_coherence(shared_by_hosts=False) is None
    assert native.require_coherence(shared_by_hosts=True, uncacheable=True) is None
    text = native.require_coherence(shared_by_hosts=True)
    assert text and "multi-host" in text and "WARNING" in capsys.readouterr().err


# --- the non-temporal kernel and gather_blocks (the KV copy engine's batch call) -------------

NT_SIZES = [1, 63, 64, 65, 4096 + 5, 16384, 3 * 16384 + 129, 70001]
NT_OFFSETS = [(0, 0), (1, 0), (37, 5), (64, 63)]


def _check_nt_copies() -> None:
    """Non-temporal copies of sizes around the kernel's steps (line, 4-page group, tail) at
    misaligned offsets land exactly, and leave the bytes around them alone."""
    src = bytes((i * 7 + 3) & 0xFF for i in range(80_000))
    for size in NT_SIZES:
        for doff, soff in NT_OFFSETS:
            dst = bytearray(b"\xee" * (size + 200))
            native._native.copy(dst, doff, src, soff, size, True)
            assert dst[doff : doff + size] == src[soff : soff + size], (size, doff, soff)
            assert dst[:doff] == b"\xee" * doff and dst[doff + size :] == b"\xee" * (200 - doff)


@pytest.mark.native
def test_nontemporal_copy_is_exact_around_every_kernel_step() -> None:
    _check_nt_copies()


@pytest.mark.native
def test_sse2_kernel_is_exact_too() -> None:
    """The kernel for CPUs without AVX2, forced on this one in a fresh process."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "from belugactl.dataplane import native\n"
        "assert native.features()['nt_copy'] in ('sse2', 'memcpy'), native.features()\n"
        "from tests.dataplane.test_native import _check_nt_copies\n"
        "_check_nt_copies()\n"
    )
    env = {**__import__("os").environ, "BELUGACTL_NATIVE_AVX2": "0"}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


GATHER_BLOCKS = [pytest.param(native._py_gather_blocks, id="python")]
GATHER_BLOCKS.append(native_param(lambda *a: native._native.gather_blocks(*a)))

# Three pieces per block: two from a [K|V][block][piece] region (K and V a whole region apart)
# and one from a [block][piece] region; 6 blocks.
NB, KV_PIECE, CPU_PIECE = 6, 40, 24
KV_BASE, CPU_BASE = 0, 2 * NB * KV_PIECE
TEMPLATE = array(
    "q", [KV_BASE, KV_PIECE, KV_PIECE, KV_BASE + NB * KV_PIECE, KV_PIECE, KV_PIECE, CPU_BASE, CPU_PIECE, CPU_PIECE]
)
BLOCK = 2 * KV_PIECE + CPU_PIECE


def _tensors() -> bytearray:
    return bytearray((i * 13 + 1) & 0xFF for i in range(CPU_BASE + NB * CPU_PIECE))


def _block_bytes(t: bytes, b: int) -> bytes:
    k = t[KV_BASE + b * KV_PIECE :][:KV_PIECE]
    v = t[KV_BASE + NB * KV_PIECE + b * KV_PIECE :][:KV_PIECE]
    return k + v + t[CPU_BASE + b * CPU_PIECE :][:CPU_PIECE]


@pytest.mark.parametrize("gather_blocks", GATHER_BLOCKS)
@pytest.mark.parametrize("nontemporal", [False, True])
def test_gather_blocks_saves_and_loads_whole_blocks(gather_blocks, nontemporal) -> None:
    tensors = _tensors()
    pool = bytearray(1024)
    # blocks 4 and 5 side by side in the pool (their CPU pieces are neighbours in both: coalesced)
    pairs = array("q", [4, 10, 5, 10 + BLOCK, 1, 700])
    assert gather_blocks(pool, tensors, TEMPLATE, pairs, True, nontemporal) == 3 * BLOCK
    assert pool[10 : 10 + BLOCK] == _block_bytes(tensors, 4)
    assert pool[10 + BLOCK : 10 + 2 * BLOCK] == _block_bytes(tensors, 5)
    assert pool[700 : 700 + BLOCK] == _block_bytes(tensors, 1)
    assert pool[:10] == bytes(10) and pool[10 + 2 * BLOCK : 700] == bytes(700 - 10 - 2 * BLOCK)

    before = bytes(tensors)
    # load them back into blocks 0, 2, 3
    assert (
        gather_blocks(pool, tensors, TEMPLATE, array("q", [0, 10, 2, 10 + BLOCK, 3, 700]), False, nontemporal)
        == 3 * BLOCK
    )
    assert _block_bytes(tensors, 0) == _block_bytes(before, 4)
    assert _block_bytes(tensors, 2) == _block_bytes(before, 5)
    assert _block_bytes(tensors, 3) == _block_bytes(before, 1)
    for b in (1, 4, 5):
        assert _block_bytes(tensors, b) == _block_bytes(before, b)


@pytest.mark.parametrize("gather_blocks", GATHER_BLOCKS)
@pytest.mark.parametrize(
    "pairs",
    [
        [0, 0, 1, 1024 - BLOCK + 1],  # second block runs past the pool's end
        [0, 0, 0, -1],  # negative pool offset
        [0, 0, -1, 200],  # negative block id
        [0, 0, NB, 200],  # block id past the tensors
        [0, 0, 2**62, 200],  # block id * stride overflows int64
    ],
)
def test_gather_blocks_refuses_anything_outside_before_copying(gather_blocks, pairs) -> None:
    tensors = _tensors()
    pool = bytearray(1024)
    with pytest.raises(ValueError):
        gather_blocks(pool, tensors, TEMPLATE, array("q", pairs), True, False)
    assert pool == bytearray(1024)  # the good first block was not copied either
    with pytest.raises(ValueError):
        gather_blocks(pool, tensors, TEMPLATE, array("q", pairs), False, False)
    assert tensors == _tensors()


@pytest.mark.parametrize("gather_blocks", GATHER_BLOCKS)
def test_gather_blocks_refuses_malformed_arrays(gather_blocks) -> None:
    tensors, pool = _tensors(), bytearray(1024)
    with pytest.raises(ValueError):
        gather_blocks(pool, tensors, TEMPLATE[:-1], array("q", [0, 0]), True, False)
    with pytest.raises(ValueError):
        gather_blocks(pool, tensors, TEMPLATE, array("q", [0, 0, 1]), True, False)
    with pytest.raises(ValueError):
        gather_blocks(pool, tensors, array("q", [0, KV_PIECE, -1]), array("q", [0, 0]), True, False)


@pytest.mark.parametrize("gather_blocks", GATHER_BLOCKS)
def test_gather_blocks_of_one_piece_each_back_to_back(gather_blocks) -> None:
    """A CPU-backend layer (one piece per block): a run of neighbouring blocks into neighbouring
    pool space is copied as one piece, and must still land byte for byte."""
    tensors, pool = _tensors(), bytearray(1024)
    one = array("q", [CPU_BASE, CPU_PIECE, CPU_PIECE])
    pairs = array("q", [x for b in range(NB) for x in (b, 3 + b * CPU_PIECE)])
    assert gather_blocks(pool, tensors, one, pairs, True, True) == NB * CPU_PIECE
    assert pool[3 : 3 + NB * CPU_PIECE] == tensors[CPU_BASE:]
