"""caching.areas / caching.memory_types: one way to say the pool's memory type, refused when two are
written or when the KV and control areas differ (the layout cannot give the KV area its own MTRRs yet)."""

import pytest

from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest_text
from tests.support.manifests import EXAMPLES

BASE = (EXAMPLES / "beluga-rack.yaml").read_text()
CACHING = (
    "caching:\n  ddio: disabled            # GPU writes to the pool then bypass the LLC\n"
    "  pool_memory_type: uncachable\n"
)


def _with(caching: str):
    assert CACHING in BASE
    return load_manifest_text(BASE.replace(CACHING, "caching:\n  ddio: disabled\n" + caching), file="m.yaml")


def test_equal_areas_mean_the_whole_pool():
    m = _with("  areas: {kv: uncachable, control: uncachable}\n")
    assert m.caching.pool_memory_type == "uncachable"
    assert m.caching.area_types() == {"kv": "uncachable", "control": "uncachable"}


def test_an_agreeing_pool_memory_type_beside_areas_is_accepted():
    # what a dump of the resolved section looks like; it must load again
    m = _with("  pool_memory_type: uncachable\n  areas: {kv: uncachable, control: uncachable}\n  memory_types: null\n")
    assert m.caching.pool_memory_type == "uncachable"


def test_pool_memory_type_alone_still_covers_both_areas():
    m = _with("  pool_memory_type: uncachable\n")
    assert m.caching.area_types() == {"kv": "uncachable", "control": "uncachable"}


@pytest.mark.parametrize(
    "caching, words",
    [
        ("  pool_memory_type: write-back\n  areas: {kv: uncachable, control: uncachable}\n", "contradicts"),
        ("  pool_memory_type: write-back\n  memory_types: seeds\n", "contradicts"),
        ("  areas: {kv: uncachable, control: uncachable}\n  memory_types: seeds\n", "not both"),
        ("  memory_types: seeds\n", "not supported yet"),
        ("  areas: {kv: uncachable, control: write-back}\n", "not supported yet"),
        ("  areas: {kv: uncachable, ring: write-back}\n", ""),
    ],
)
def test_contradictions_and_splits_are_refused_with_a_line(caching: str, words: str):
    with pytest.raises(ManifestError) as info:
        _with(caching)
    text = str(info.value.problems[0])
    assert text.startswith("m.yaml:") and text.split(":")[1].isdigit()
    assert words in text
