"""The journal covers the pool at the smallest block: manifest check (every load) refuses one that cannot,
with file:line and the size that would; a manifest without a journal gets one that covers the pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.dataplane.mds.journal import coverage_bytes
from belugactl.errors import ManifestError
from belugactl.model import journal_sizing as js
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RACK = (EXAMPLES / "beluga-rack.yaml").read_text()


def test_the_rule_agrees_with_the_journals_own_encoder() -> None:
    for ns in (1, 35, 200):
        for blocks in (0, 1, 1000):
            assert js.journal_bytes(blocks, 1, ns) == coverage_bytes(blocks, ns)
    # The figure: the 16-host rack's 1 GiB journal held 4.79 M one-extent blocks.
    assert 4_700_000 < js.blocks_covered(1 << 30, js.namespace_bytes("beluga-rack", 1)) < 4_900_000


def test_every_example_is_covered_and_keeps_its_journal() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        m = load_manifest_text(path.read_text(), file=str(path))  # raises if the rule refused it
        assert m.layout.metadata.journal == resolve_layout(m).journal.size


def test_a_journal_that_cannot_cover_the_pool_is_refused_with_file_line_and_the_size() -> None:
    text = RACK.replace("    journal: 1GiB\n", "    journal: 1GiB\n    min_block: 64KiB\n")
    with pytest.raises(ManifestError) as exc:
        load_manifest_text(text, file="rack.yaml")
    [problem] = exc.value.problems
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip() == "journal: 1GiB")
    assert problem.location.file == "rack.yaml" and problem.location.line == line
    assert problem.path == "layout.metadata.journal" and "min_block 64 KiB" in problem.message
    assert problem.hint is not None and problem.hint.startswith("use journal: ")
    # The size the hint names is accepted; so is the min_block it offers instead.
    size = problem.hint.split("use journal: ", 1)[1].split(",", 1)[0]
    load_manifest_text(text.replace("journal: 1GiB", f"journal: {size.replace(' ', '')}"), file="rack.yaml")
    block = problem.hint.rsplit("min_block: ", 1)[1]
    load_manifest_text(RACK.replace("    journal: 1GiB\n", f"    journal: 1GiB\n    min_block: {block}\n"))


def test_a_manifest_without_a_journal_gets_one_that_covers_the_pool() -> None:
    text = RACK.replace("    journal: 1GiB\n", "")
    m = load_manifest_text(text)
    layout = resolve_layout(m)
    ns = js.namespace_bytes(m.name, 1)
    assert layout.journal.size >= js.journal_bytes(layout.shared_kv.size, js.DEFAULT_MIN_BLOCK, ns)
    assert layout.journal.size % m.pool.align == 0
    small = load_manifest_text((EXAMPLES / "lab.yaml").read_text().replace("    journal: 4MiB\n", ""))
    assert small.layout.metadata.journal == 4 << 20  # small pools keep the old default: same layout hash
