"""pool.source.memdevs: `all`, a list of serials, or `{switch, count}`; each bad form is a file:line error."""

from __future__ import annotations

import json

import pytest

from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest_text
from belugactl.model.manifest_schema import MemdevPick
from tests.support.manifests import MINIMAL

MEMDEVS_LINE = 6  # `    memdevs: all` in MINIMAL


def _with(memdevs: str, interleave: str | None = None) -> str:
    text = MINIMAL.replace("    memdevs: all\n", f"    memdevs: {memdevs}\n")
    assert text != MINIMAL or memdevs == "all"
    if interleave is not None:
        text = text.replace("  size: 510MiB\n", f"  size: 510MiB\n  interleave: {interleave}\n")
    return text


def _load(memdevs: str, interleave: str | None = "{mode: hardware, ways: 2}"):
    return load_manifest_text(_with(memdevs, interleave), file="m.yaml").pool.source.memdevs


def _problems(memdevs: str, interleave: str | None = "{mode: hardware, ways: 2}") -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(_with(memdevs, interleave), file="m.yaml")
    return [str(p) for p in info.value.problems]


def test_all_and_serials_are_unchanged():
    assert _load("all", None) == "all"
    assert _load("[0x10, 0x11]") == ["16", "17"]


def test_switch_and_count_together():
    pick = _load('{switch: "0000:0d:00.0", count: 2}')
    assert pick == MemdevPick(switch="0000:0d:00.0", count=2)


def test_switch_any_alone_and_count_alone():
    assert _load("{switch: any}", None) == MemdevPick(switch="any")
    assert _load("{count: 2}") == MemdevPick(count=2)


def test_block_form_and_short_bdf_normalised():
    text = _with("\n      switch: 0D:00.0\n      count: 2", "{mode: hardware, ways: 2}")
    pick = load_manifest_text(text, file="m.yaml").pool.source.memdevs
    # lspci's short form means domain 0000; discovery prints lower case
    assert pick == MemdevPick(switch="0000:0d:00.0", count=2)


@pytest.mark.parametrize("count", ["0", "-1", "17"])
def test_count_out_of_range(count: str):
    assert _problems(f"{{count: {count}}}") == [
        f"m.yaml:{MEMDEVS_LINE}:22: pool.source.memdevs.count: count is the number of memdevs in the region: 1 to 16"
    ]


def test_count_must_be_an_integer():
    (problem,) = _problems("{count: two}")
    assert problem.startswith(f"m.yaml:{MEMDEVS_LINE}:22: pool.source.memdevs.count: ")
    assert "integer" in problem


def test_unknown_key_with_did_you_mean():
    assert _problems("{switch: any, cout: 2}") == [
        f"m.yaml:{MEMDEVS_LINE}:28: pool.source.memdevs.cout: unknown key 'cout' (did you mean 'count'?)"
    ]


def test_switch_not_a_bdf_nor_any():
    assert _problems("{switch: sw0}") == [
        f"m.yaml:{MEMDEVS_LINE}:23: pool.source.memdevs.switch: expected \"any\" or the PCI address of the "
        "switch's upstream port such as 0000:0d:00.0, got 'sw0'"
    ]


def test_a_bare_bdf_that_yaml_reads_as_base_60_says_quote_it():
    (problem,) = _problems("{switch: 0000:10:00.0}")
    assert problem.startswith(f"m.yaml:{MEMDEVS_LINE}:23: pool.source.memdevs.switch: ")
    assert "600.0" in problem and 'quote it: switch: "0000:10:00.0"' in problem
    # quoted, the same address is fine
    assert _load('{switch: "0000:10:00.0"}', None) == MemdevPick(switch="0000:10:00.0")


def test_an_empty_mapping_says_what_it_takes():
    (problem,) = _problems("{}")
    assert problem.startswith(f"m.yaml:{MEMDEVS_LINE}:14: pool.source.memdevs: give switch")


def test_a_word_other_than_all_lists_the_three_forms():
    (problem,) = _problems("any")
    assert '"all", a list of memdev serial numbers, or a mapping' in problem


def test_ways_must_equal_count():
    assert _problems("{switch: any, count: 3}") == [
        "m.yaml:8:38: pool.interleave.ways: 2 interleave ways but memdevs.count is 3; a region interleaves "
        "across exactly its memdevs (set pool.interleave.ways: 3, or memdevs.count: 2)"
    ]


def test_default_ways_against_count_points_at_the_count():
    # No interleave block: ways is the default 1, which is nowhere in the file.
    assert _problems("{count: 2}", None) == [
        f"m.yaml:{MEMDEVS_LINE}:22: pool.source.memdevs.count: 1 interleave way (the default) but memdevs.count "
        "is 2; a region interleaves across exactly its memdevs (set pool.interleave.ways: 2, or memdevs.count: 1)"
    ]


def test_software_interleave_does_not_tie_count_to_ways():
    assert _load("{count: 2}", "{mode: software, ways: 1, granularity: 2MiB}") == MemdevPick(count=2)


def test_switch_alone_takes_any_ways():
    assert _load("{switch: any}", "{mode: hardware, ways: 4}") == MemdevPick(switch="any")


def test_json_dump_and_schema_show_the_mapping_form(capsys):
    from belugactl.cli.app import run

    manifest = load_manifest_text(_with('{switch: "0000:0d:00.0", count: 2}', "{ways: 2}"), file="m.yaml")
    assert manifest.pool.model_dump(mode="json")["source"]["memdevs"] == {"switch": "0000:0d:00.0", "count": 2}
    assert run(["manifest", "schema"]) == 0
    doc = json.loads(capsys.readouterr().out)
    forms = doc["$defs"]["RegionSource"]["properties"]["memdevs"]["oneOf"]
    assert {"$ref": "#/$defs/MemdevPick"} in forms
    assert {"const": "all", "type": "string"} in forms[0]["anyOf"]
    pick = doc["$defs"]["MemdevPick"]
    assert set(pick["properties"]) == {"switch", "count"} and pick["additionalProperties"] is False


def test_manifest_check_prints_the_selection(capsys):
    from belugactl.cli.app import run
    from tests.support.manifests import REPO

    assert run(["manifest", "check", "-f", str(REPO / "tests" / "manifests" / "lab-ram-switch.yaml")]) == 0
    assert ("pool source: a ram CXL region on memdevs: the first 2 by serial behind the one switch this host has; "
            "hardware interleave, 2 ways x 4 KiB") in capsys.readouterr().out


def test_each_form_reads_as_words():
    from belugactl.workflows.memdev_choice import MemdevWant

    def words(memdevs: str, interleave: str | None = "{ways: 2}") -> str:
        return MemdevWant.from_manifest(_load(memdevs, interleave)).describe()

    assert words("all", None) == "all (every memdev with capacity of the region's type, by serial)"
    assert words("[0x10, 17]") == "serials 0x10, 0x11 (in that order)"
    assert words('{switch: "0000:0d:00.0"}', None) == "every memdev behind switch 0000:0d:00.0, by serial"
    assert words("{count: 2}") == "the first 2 by serial with capacity of the region's type"
