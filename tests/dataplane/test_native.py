"""The native helper and its pure-Python stand-ins must agree; offsets outside the buffer never touch memory."""

from __future__ import annotations

import mmap
from array import array

import pytest

from belugactl.dataplane import native

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
if native._native is not None:
    n = native._native
    IMPLS.append(
        pytest.param(
            {
                "load64": n.load64,
                "store64": n.store64,
                "cas64": n.cas64,
                "fetch_add64": n.fetch_add64,
                "wait64": n.wait64,
                "flush": n.flush,
                "copy": n.copy,
                "gather": n.gather,
            },
            id="native",
        )
    )


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


def test_native_rejects_unaligned_words(shared) -> None:
    if native._native is None:
        pytest.skip("native helper not built")
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
