"""A memory-type split in a lab guest (issue 33 item 1): setup marks exactly the shared KV area's
pieces uncachable at the guest's own dax base (or refuses with the counts when the guest has too few
free variable MTRRs), and a write-back manifest removes them again. Runs on the `pmem_pair` before
tests/setup/test_setup_lab.py tears it down. What it shows: the tool flow and the ranges on a real
kernel's /proc/mtrr; an emulated device's speed says nothing about the memory types'."""

from __future__ import annotations

import re

import pytest

from belugactl.host.write_mtrr import parse_mtrr
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.topics.mtrr import span_pieces
from tests.support.manifests import REPO
from tests.support.pmem_pair import MANIFEST, PmemPair

pytestmark = pytest.mark.lab

SPLIT = {
    "pool_memory_type: write-back": "memory_types: seeds\n  kv_mtrrs: 8",
    "shared_kv: 254MiB": "shared_kv: 128MiB",
    "partition_size: equal ": "partition_size: 64MiB",
}
SHARED = "/run/belugactl-lab/share/split.yaml"
MARK = "=== {} ==="


def _sections(stdout: str) -> dict[str, str]:
    parts = re.split(r"^=== (\w+) ===$", stdout, flags=re.M)
    return {name: body for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_a_split_marks_exactly_the_kv_pieces_in_a_guest_and_write_back_removes_them(pmem_pair: PmemPair) -> None:
    lab = pmem_pair
    text = (REPO / MANIFEST).read_text()
    for old, new in SPLIT.items():
        assert old in text, old
        text = text.replace(old, new)
    (lab.share("lab-1") / "split.yaml").write_text(text)
    kv = resolve_layout(load_manifest_text(text)).shared_kv
    script = "; ".join([
        f"echo '{MARK.format('before')}'", "cat /proc/mtrr",
        f"echo '{MARK.format('base')}'", "cat /sys/bus/dax/devices/dax0.0/resource",
        f"echo '{MARK.format('setup')}'", f"belugactl setup -f {SHARED} --host lab-1 --only mtrr 2>&1; echo rc=$?",
        f"echo '{MARK.format('after')}'", "cat /proc/mtrr",
    ])
    out = _sections(lab.sh("lab-1", "sh", "-c", script).stdout)
    before = parse_mtrr(out["before"])
    base = int(out["base"].strip(), 16)
    pieces = span_pieces(base, kv.offset, kv.size)
    free = 8 - len(before)  # QEMU's CPUs have 8 variable MTRRs
    if len(pieces) > free:
        assert "rc=2" in out["setup"], out["setup"]
        assert f"needs {len(pieces)} MTRR(s) on this host" in out["setup"]
        assert parse_mtrr(out["after"]) == before
        return
    assert "rc=0" in out["setup"], out["setup"]
    added = [(e.base, e.size) for e in parse_mtrr(out["after"]) if e not in before]
    assert sorted(added) == sorted(pieces)
    assert all(e.type == "uncachable" for e in parse_mtrr(out["after"]) if (e.base, e.size) in pieces)
    back = lab.sh("lab-1", "sh", "-c", f"belugactl setup -f {MANIFEST} --host lab-1 --only mtrr 2>&1; echo rc=$?; "
                  "cat /proc/mtrr")
    assert "rc=0" in back.stdout, back.stdout
    assert [(e.base, e.size, e.type) for e in parse_mtrr(back.stdout)] == [(e.base, e.size, e.type) for e in before]
