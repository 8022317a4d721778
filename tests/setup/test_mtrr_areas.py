"""Per-host MTRR pieces for a span given in pool offsets, and the granule that fits the free registers."""

from belugactl.units import GiB, MiB
from belugactl.workflows.setup.topics.mtrr import granule_that_fits, span_pieces

TIB = 1024 * GiB


def test_a_kv_span_at_pool_start_on_an_aligned_base_is_two_pieces():
    assert span_pieces(4 * TIB, 0, 3 * TIB) == [(4 * TIB, 2 * TIB), (6 * TIB, TIB)]


def test_a_small_control_head_before_the_kv_span_costs_many_pieces():
    # why the layout must place the control areas with the KV span's MTRR count in mind
    pieces = span_pieces(4 * TIB, 16 * GiB, 4 * TIB - 32 * GiB)
    assert sum(s for _, s in pieces) == 4 * TIB - 32 * GiB
    assert all(b % s == 0 for b, s in pieces)
    assert [s // GiB for _, s in pieces[:6]] == [16, 32, 64, 128, 256, 512]
    assert len(pieces) == 14


def test_an_odd_base_needs_more_pieces_than_an_aligned_one():
    odd = span_pieces(4 * TIB + 2 * MiB, 0, 64 * GiB)
    even = span_pieces(4 * TIB, 0, 64 * GiB)
    assert even == [(4 * TIB, 64 * GiB)] and len(odd) > 8


def test_granule_that_fits_rounds_inward_until_the_pieces_fit():
    base, off, size = 4 * TIB + 2 * MiB, 16 * GiB + 4096, 64 * GiB
    g = granule_that_fits(base, off, size, free=3)
    assert g is not None and g > 4096
    start = -(-(base + off) // g) * g
    end = (base + off + size) // g * g
    assert len(span_pieces(0, start, end - start)) <= 3
    assert granule_that_fits(base, off, size, free=0) is None
