"""doctor's metadata.journal: the manifest's journal covers the pool, and no server had to stop journaling."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from belugactl.dataplane.mds.journal import STOP_AT, stop_record
from belugactl.host.host import Host
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.workflows.doctor import DoctorContext, Status, builtin_registry
from belugactl.workflows.doctor.expectations import from_manifest
from tests.support.doctor_snapshots import beluga_like

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab.yaml"
CHECK = builtin_registry().get("metadata.journal")


def _ctx(tmp_path: Path, manifest, stop: bytes = b"") -> DoctorContext:
    exp = from_manifest(manifest, manifest.host("lab-1"))
    assert exp.layout is not None
    off = exp.layout.journal.offset
    (tmp_path / "dev").mkdir(parents=True, exist_ok=True)
    data = bytearray(off + 4096 + (2 << 20))
    data[off + STOP_AT : off + STOP_AT + len(stop)] = stop
    (tmp_path / "dev" / "dax0.0").write_bytes(bytes(data))
    snap = beluga_like()
    snap = replace(snap, dax=[replace(snap.dax[0], size=exp.pool_size)])
    return DoctorContext(snap, exp, Host(tmp_path))


def test_no_stop_record_and_a_covering_journal_is_ok(tmp_path: Path) -> None:
    result = CHECK.run(_ctx(tmp_path, load_manifest(LAB)))
    assert result.status is Status.OK and "no stop record in the journal area" in result.reason


def test_a_stop_record_fails_with_why_and_what_to_do(tmp_path: Path) -> None:
    record = stop_record(1_765_000_000 * 10**9, 7, "the live index fills the journal; journaling stopped")
    result = CHECK.run(_ctx(tmp_path, load_manifest(LAB), record))
    assert result.status is Status.FAIL
    assert "epoch 7 stopped journaling" in result.reason and "fills the journal" in result.reason
    assert "layout.metadata.journal" in (result.fix or "")
    assert result.details["stop"]["epoch"] == 7


def test_a_journal_that_cannot_cover_the_pool_fails(tmp_path: Path) -> None:
    # What the manifest rule refuses at load; a manifest built past it (an older belugactl's) still gets told.
    m = load_manifest(LAB)
    metadata = m.layout.metadata.model_copy(update={"min_block": 4096})
    small = m.model_copy(update={"layout": m.layout.model_copy(update={"metadata": metadata})})
    result = CHECK.run(_ctx(tmp_path, small))
    assert result.status is Status.FAIL and "a full pool would stop journaling" in result.reason
    assert "at least" in (result.fix or "")
    load_manifest_text(LAB.read_text())  # the example itself is covered
