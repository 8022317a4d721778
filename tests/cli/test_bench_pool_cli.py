"""`belugactl bench pool` (issue 33 item 3): its JSON document, the flags it refuses (exit 2), a pool
it will not write, and one manifest parse. Figures are not asserted (no wall-clock checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.pool.file_pool import create_file_pool
from tests.support.paths import CPU_DEMO

pytestmark = pytest.mark.native

MARK = (8 << 20) + (64 << 10)  # inside cpu-demo's shared KV area, where a read-only run reads
SMALL = ("--size", "1MiB", "--threads", "1,2", "--repeat", "1")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch.pool"
    with open(path, "wb") as f:
        f.truncate(8 << 20)
    return path


def test_json_has_dram_and_the_pool_side_by_side_with_ratios(cli, scratch):
    result = cli("bench", "pool", "--pool", str(scratch), *SMALL, "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pool"]["kind"] == "file" and doc["pool"]["emulated"] is False
    assert doc["pool"]["access"]["mode"] == "read-write" and doc["interleave"]["mode"] == "file"
    assert [(r["region"], r["threads"]) for r in doc["rows"]] == [("dram", 1), ("device 0", 1), ("dram", 2),
                                                                  ("device 0", 2)]  # fmt: skip
    pool_row = doc["rows"][1]
    assert set(pool_row) >= {"load_latency_ns", "read_gb_per_s", "write_nt_gb_per_s", "bytes", "vs_dram"}
    assert set(pool_row["vs_dram"]) == {"load_latency", "read", "write"}
    assert [v["figure"] for v in doc["expect"]] == ["load_latency_ns", "read_gbps_per_device", "write_gbps_per_device"]
    assert any("not CXL" in n for n in doc["notes"])
    text = cli("bench", "pool", "--pool", str(scratch), *SMALL)
    assert text.code == 0 and "x DRAM" in text.stdout and "file, not CXL" in text.stdout


@pytest.mark.parametrize(
    "flags, says",
    [
        (("--threads", "0"), "between 1 and"),
        (("--threads", "two"), "expected a number"),
        (("--threads", "1,,x"), "expected a number"),
        (("--size", "12parsecs"), "expected a size"),
        (("--size", "4KiB"), "at least 1MiB"),
        (("--repeat", "0"), "at least 1"),
    ],
)
def test_bad_flags_exit_2(cli, scratch, flags, says):
    result = cli("bench", "pool", "--pool", str(scratch), *flags)
    assert result.code == 2 and says in result.stderr, result.stderr


def test_no_pool_a_missing_pool_and_host_without_manifest_exit_2(cli, tmp_path):
    assert cli("bench", "pool").code == 2
    missing = cli("bench", "pool", "--pool", str(tmp_path / "nope"))
    assert missing.code == 2 and "no such device or file" in missing.stderr
    assert cli("bench", "pool", "--pool", str(tmp_path), "--host", "x").code == 2


def test_a_pool_with_a_header_is_read_only_and_parses_its_manifest_once(cli, tmp_path, model_calls):
    pool = tmp_path / "demo.pool"
    create_file_pool(pool, CPU_DEMO)
    model_calls.clear()
    refused = cli("bench", "pool", "-f", str(CPU_DEMO), "--pool", str(pool), *SMALL)
    assert refused.code == 2 and "--read-only" in refused.stderr
    assert model_calls["manifest parses"] == 1 and model_calls["layout resolutions"] <= 1, dict(model_calls)
    with open(pool, "r+b") as f:  # bytes in the range it will read, to see that they stay
        f.seek(MARK)
        f.write(b"kv block" * 4096)
    result = cli("bench", "pool", "-f", str(CPU_DEMO), "--pool", str(pool), *SMALL, "--read-only", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pool"]["access"]["mode"] == "read-only" and "shared KV" in doc["pool"]["access"]["area"]
    assert all(r["write_nt_gb_per_s"] is None for r in doc["rows"])
    (region,) = doc["regions"]
    assert region["offset"] <= MARK < region["offset"] + region["length"]
    with open(pool, "rb") as f:
        f.seek(MARK)
        assert f.read(8 * 4096) == b"kv block" * 4096  # nothing written
