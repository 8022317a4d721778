"""The positioned YAML reader on its own: positions, duplicates, and documents built to hurt."""

import pytest

from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest_text
from belugactl.model.manifest_yaml import Position, YamlSyntaxError, load_positioned


def test_positions_of_keys_and_values():
    doc = load_positioned("a:\n  b: [1, 2]\n  c: x\n")
    assert doc.key_positions[("a", "c")] == Position(3, 3)
    assert doc.value_positions[("a", "c")] == Position(3, 6)
    assert doc.value_positions[("a", "b", 1)] == Position(2, 10)
    # a path that runs past the document falls back to the deepest known position
    assert doc.position_of(("a", "b", 7, "z")) == Position(2, 6)


def test_duplicate_keys_in_nested_mappings():
    with pytest.raises(YamlSyntaxError) as info:
        load_positioned("a:\n  b: 1\n  b: 2\nc: 1\nc: 2\n")
    assert [(p.position, p.message.split(" (")[0]) for p in info.value.problems] == [
        (Position(3, 3), "duplicate key 'b'"),
        (Position(5, 1), "duplicate key 'c'"),
    ]


def test_alias_bomb_is_refused_quickly():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=False):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]")
    with pytest.raises(ManifestError) as info:
        load_manifest_text("\n".join(lines) + "\n")
    assert "too large" in info.value.problems[0].message


def test_deep_nesting_is_refused():
    with pytest.raises(ManifestError):
        load_manifest_text("a: " + "[" * 100 + "]" * 100 + "\n")


def test_non_scalar_key_is_refused():
    with pytest.raises(YamlSyntaxError) as info:
        load_positioned("? [a, b]\n: 1\n")
    assert "plain scalar" in info.value.problems[0].message
