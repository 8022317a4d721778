"""caching.areas / caching.memory_types: one way to say the pool's memory type, refused when two are
written or contradict; a split (KV uncachable, control write-back) loads, its inverse is refused."""

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


def test_the_seeds_preset_is_a_split_whose_pool_memory_type_is_the_control_areas():
    m = _with("  memory_types: seeds\n")
    assert m.caching.split and m.caching.area_types() == {"kv": "uncachable", "control": "write-back"}
    # the CPU's paths (mapping, serve's coherence) read pool_memory_type: they must flush for write-back
    assert m.caching.pool_memory_type == "write-back"
    assert m.caching.kv_mtrrs == 4


def test_a_split_dump_loads_again():
    m = _with("  pool_memory_type: write-back\n  memory_types: seeds\n  areas: null\n  kv_mtrrs: 4\n")
    assert m.caching.split
    m = _with("  areas: {kv: uncachable, control: write-back}\n")
    assert m.caching.split and m.caching.pool_memory_type == "write-back"


@pytest.mark.parametrize(
    "caching, words",
    [
        ("  pool_memory_type: write-back\n  areas: {kv: uncachable, control: uncachable}\n", "contradicts"),
        ("  pool_memory_type: uncachable\n  memory_types: seeds\n", "contradicts"),
        ("  areas: {kv: uncachable, control: uncachable}\n  memory_types: seeds\n", "not both"),
        ("  areas: {kv: write-back, control: uncachable}\n", "memory_types: seeds"),
        ("  memory_types: seeds\n  kv_mtrrs: 9\n", "kv_mtrrs is 1 to 8"),
        ("  memory_types: seeds\n  kv_mtrrs: 0\n", "kv_mtrrs is 1 to 8"),
        ("  areas: {kv: uncachable, ring: write-back}\n", ""),
    ],
)
def test_contradictions_and_splits_are_refused_with_a_line(caching: str, words: str):
    with pytest.raises(ManifestError) as info:
        _with(caching)
    text = str(info.value.problems[0])
    assert text.startswith("m.yaml:") and text.split(":")[1].isdigit()
    assert words in text
