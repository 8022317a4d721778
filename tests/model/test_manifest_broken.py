"""The broken-manifest corpus: each file ends with `# expect:` lines naming every problem, in order,
as `line:column: field.path: message (hint)`. Trailing comments do not move any position above them."""

from pathlib import Path

import pytest

from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest
from tests.support.manifests import BROKEN

CORPUS = sorted(BROKEN.glob("*.yaml"))


def _expected(path: Path) -> list[str]:
    return [line.removeprefix("# expect: ") for line in path.read_text().splitlines() if line.startswith("# expect: ")]


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 15
    assert all(_expected(p) for p in CORPUS), "every broken manifest states what it expects"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_manifest_reports_exact_location_and_message(path: Path):
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    got = [str(p).removeprefix(f"{path}:") for p in info.value.problems]
    assert got == _expected(path)
    line_count = len(path.read_text().splitlines())
    for problem in info.value.problems:
        assert problem.location.file == str(path)
        assert problem.location.line is not None and 1 <= problem.location.line <= line_count
        assert problem.location.column is not None and problem.location.column >= 1


def test_problem_position_points_at_the_offending_text():
    path = BROKEN / "unknown-key-typo.yaml"
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    (problem,) = info.value.problems
    line = path.read_text().splitlines()[problem.location.line - 1]
    assert line[problem.location.column - 1 :].startswith("allign")


def test_every_problem_is_collected_not_just_the_first():
    with pytest.raises(ManifestError) as info:
        load_manifest(BROKEN / "several-problems.yaml")
    assert len(info.value.problems) == 4
    assert info.value.what.endswith("4 problems in the manifest")
