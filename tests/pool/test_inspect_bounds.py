"""`pool inspect` bounds its work by what it reads, not by what a header claims: a crafted header
with 4 M rings (issue 30: past 60 s and 1.35 GiB before) is summarised after a bounded scan."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.pool.geometry import PoolGeometry
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows import pool_inspect
from belugactl.workflows.pool_inspect import LIST_RINGS_MAX, MAX_LAYOUT_RINGS, SCAN_SLOTS_MAX, inspect_pool

MiB = 1 << 20
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing answers HTTP there


def _crafted(pool_path: Path, out: Path, *, rings: int, slots: int = 1, slot_size: int = 64) -> Path:
    """A sparse pool file whose header (CRC and geometry valid) says `rings` rings of `slots` slots."""
    with PoolMapping.open(pool_path, writable=False) as pool:
        header = pool.header
    stride = slots * slot_size
    rpc = 2 * MiB
    journal = rpc + rings * stride
    shared = journal + 2 * MiB
    size = shared + 4 * MiB
    geometry = PoolGeometry(
        pool_size=size, rpc_offset=rpc, ring_count=rings, slots_per_ring=slots, slot_size=slot_size,
        ring_stride=stride, journal_offset=journal, journal_size=2 * MiB, shared_kv_offset=shared,
        shared_kv_size=4 * MiB,
    )  # fmt: skip
    hosts = tuple(dataclasses.replace(h, offset=0, size=0) for h in header.hosts)
    crafted = dataclasses.replace(header, geometry=geometry, hosts=hosts)
    with open(out, "wb") as f:
        f.truncate(size)  # sparse: the ring area reads as zeros, never used
        f.write(crafted.pack())
    os.chmod(out, 0o600)
    return out


def test_four_million_rings_are_summarised_not_read(tmp_path: Path, pool_path: Path) -> None:
    path = _crafted(pool_path, tmp_path / "hostile.pool", rings=4 << 20)
    doc = inspect_pool(path, admin_url=NOBODY)
    summary = doc["rings_summary"]
    assert summary["count"] == 4 << 20 and MAX_LAYOUT_RINGS < 4 << 20
    assert doc["rings"] == [] and summary["scanned"] == 0 and not summary["complete"]
    assert "at most" in summary["problem"]


def test_a_plausible_but_huge_ring_count_reads_a_bounded_number_of_slots(
    tmp_path: Path, pool_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _crafted(pool_path, tmp_path / "big.pool", rings=MAX_LAYOUT_RINGS, slots=4)
    reads = 0
    real = pool_inspect._slot_header

    def counted(pool: PoolMapping, offset: int) -> tuple[int, ...]:
        nonlocal reads
        reads += 1
        return real(pool, offset)

    monkeypatch.setattr(pool_inspect, "_slot_header", counted)
    doc = inspect_pool(path, admin_url=NOBODY)
    summary = doc["rings_summary"]
    assert reads == SCAN_SLOTS_MAX and summary["scanned"] == SCAN_SLOTS_MAX // 4
    assert not summary["complete"] and "only the first" in summary["problem"]
    # more rings than LIST_RINGS_MAX: only used ones are listed (none here)
    assert MAX_LAYOUT_RINGS > LIST_RINGS_MAX and doc["rings"] == [] and summary["listed"] == 0


def test_the_cli_says_so_and_exits_0(tmp_path: Path, pool_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _crafted(pool_path, tmp_path / "hostile.pool", rings=4 << 20)
    assert run(["pool", "inspect", str(path), "--admin", NOBODY, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rings_summary"]["complete"] is False and len(doc["rings"]) == 0


def test_an_ordinary_pool_lists_every_ring(pool_path: Path) -> None:
    doc = inspect_pool(pool_path, admin_url=NOBODY)
    summary = doc["rings_summary"]
    assert summary["complete"] and summary["problem"] is None
    assert len(doc["rings"]) == summary["count"] == summary["scanned"] == summary["listed"] > 0


def test_the_text_output_says_the_rings_were_not_all_read(
    tmp_path: Path, pool_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _crafted(pool_path, tmp_path / "hostile.pool", rings=4 << 20)
    assert run(["pool", "inspect", str(path), "--admin", NOBODY]) == 0
    assert "NOT ALL READ: the header says 4194304 RPC rings" in " ".join(capsys.readouterr().out.split())
