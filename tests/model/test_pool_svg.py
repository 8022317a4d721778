"""Proportional widths and SVG escaping."""

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.pool_svg import proportional_widths, render_svg
from tests.support.manifests import MINIMAL


@given(st.lists(st.integers(0, 1 << 45), min_size=1, max_size=40), st.integers(40, 2000), st.integers(1, 4))
def test_widths_sum_exactly_and_respect_the_minimum(sizes, width, min_width):
    widths = proportional_widths(sizes, width, min_width)
    assert len(widths) == len(sizes)
    assert all(w >= min_width for w in widths)
    if width >= len(sizes) * min_width:
        assert sum(widths) == width


def test_widths_follow_sizes():
    assert proportional_widths([1, 1, 2], 40, 0) == [10, 10, 20]
    small, big = proportional_widths([2, 8 << 40], 100, 4)
    assert small == 4 and big == 96


@pytest.mark.parametrize("title", ['a <b> & "c"', "plain"])
def test_svg_escapes_text(title):
    layout = resolve_layout(load_manifest_text(MINIMAL))
    root = ET.fromstring(render_svg(layout, title=title))
    assert root.find("{http://www.w3.org/2000/svg}title").text == title
