"""`belugactl plan` with a memory-type split on the lab guest's captured tree: the KV area's MTRR
pieces at the guest's dax base, the control areas left write-back; `pool show` says each area's type."""

from __future__ import annotations

from pathlib import Path

from tests.support.manifests import EXAMPLES, REPO

SPLIT = {
    "pool_memory_type: write-back": "memory_types: seeds\n  kv_mtrrs: 8",
    "shared_kv: 254MiB": "shared_kv: 128MiB",
    "partition_size: equal ": "partition_size: 64MiB",
}
TREE = REPO / "tests" / "fixtures" / "lab-guest"


def _split_manifest(tmp_path: Path) -> str:
    text = (EXAMPLES / "lab.yaml").read_text()
    for old, new in SPLIT.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "split.yaml"
    path.write_text(text)
    return str(path)


def test_plan_lists_exactly_the_kv_pieces_at_the_hosts_dax_base(cli, tmp_path):
    result = cli("plan", "-f", _split_manifest(tmp_path), "--root", str(TREE), "--host", "lab-1", "--only", "mtrr")
    assert result.code == 0, result.stderr
    # dax0.0 at 0x3d0200000 (2 MiB aligned): the 128 MiB KV area at pool offset 256 MiB takes 7 pieces
    lines = [line.strip() for line in result.stdout.splitlines() if "/proc/mtrr" in line]
    assert lines[0] == '$ echo "base=0x3e0200000 size=0x200000 type=uncachable" > /proc/mtrr'
    assert lines[-1] == '$ echo "base=0x3e8000000 size=0x200000 type=uncachable" > /proc/mtrr'
    assert len(lines) == 7
    assert "shared KV area" in result.stdout and "header, rings, journal stay write-back" in result.stdout


def test_pool_show_says_which_area_has_which_type(cli, tmp_path):
    result = cli("pool", "show", "-f", _split_manifest(tmp_path), env={"COLUMNS": "200"})
    assert result.code == 0, result.stderr
    kv = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("shared-kv"))
    rings = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("rpc-rings"))
    assert "uncachable" in kv and "1 MTRR piece(s)" in kv
    assert "write-back" in rings
