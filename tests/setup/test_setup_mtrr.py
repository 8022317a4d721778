"""MTRR range splitting (property-tested) and /proc/mtrr parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from belugactl.host.write_mtrr import parse_mtrr
from belugactl.workflows.setup.topics.mtrr import split_range

PAGE = 4096


def min_pieces(first: int, count: int) -> int:
    """Independent oracle: the fewest aligned power-of-two blocks tiling pages [first, first+count), by DP."""
    end = first + count
    best = {end: 0}
    for x in range(end - 1, first - 1, -1):
        options = []
        size = 1
        while x % size == 0 and x + size <= end:
            options.append(1 + best[x + size])
            size *= 2
            if x == 0 and size > end:
                break
        best[x] = min(options)
    return best[first]


pages = st.integers(min_value=0, max_value=(1 << 36) // PAGE)


@given(pages, st.integers(min_value=1, max_value=(1 << 36) // PAGE))
def test_pieces_are_aligned_powers_of_two_covering_the_range_exactly(base_pages, size_pages):
    base, size = base_pages * PAGE, size_pages * PAGE
    pieces = split_range(base, size)
    cursor = base
    for b, s in pieces:
        assert b == cursor
        assert s & (s - 1) == 0 and s >= PAGE
        assert b % s == 0
        cursor += s
    assert cursor == base + size


@given(st.integers(min_value=0, max_value=4096), st.integers(min_value=1, max_value=4096))
def test_piece_count_is_minimal(first_page, page_count):
    assert len(split_range(first_page * PAGE, page_count * PAGE)) == min_pieces(first_page, page_count)


def test_examples():
    assert split_range(0, 8 << 40) == [(0, 8 << 40)]
    assert split_range(0x290000000, 512 << 20) == [(0x290000000, 256 << 20), (0x2A0000000, 256 << 20)]
    assert split_range(0x100000000, 510 << 20) == [
        (0x100000000, 256 << 20), (0x110000000, 128 << 20), (0x118000000, 64 << 20), (0x11C000000, 32 << 20),
        (0x11E000000, 16 << 20), (0x11F000000, 8 << 20), (0x11F800000, 4 << 20), (0x11FC00000, 2 << 20),
    ]


@pytest.mark.parametrize(("base", "size"), [(1, PAGE), (0, 0), (0, 100)])
def test_rejects_ranges_the_kernel_would(base, size):
    with pytest.raises(ValueError):
        split_range(base, size)


def test_parse_kernel_format():
    text = (
        "reg00: base=0x000000000 (    0MB), size= 2048MB, count=1: write-back\n"
        "reg01: base=0x0c0000000 ( 3072MB), size= 1024MB, count=1: uncachable\n"
        "reg02: base=0x2080000000 (133120MB), size=  512KB, count=2: write-combining\n"
        "garbage line\n"
    )
    entries = parse_mtrr(text)
    assert [(e.reg, e.base, e.size, e.type, e.count) for e in entries] == [
        (0, 0, 2 << 30, "write-back", 1),
        (1, 0xC0000000, 1 << 30, "uncachable", 1),
        (2, 0x2080000000, 512 << 10, "write-combining", 2),
    ]
