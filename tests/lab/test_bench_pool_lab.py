"""`belugactl bench pool` inside a lab guest, on the pmem lab's real /dev/dax0.0 (issue 33 item 3).

The pool is set up (the `pmem_pair`, tests/support/pmem_pair.py) and its layout uses every byte, so
the bench may only read: `--read-only` over the shared KV area, the mapping read-only. What this
proves: the command maps a real devdax device, finds its header and KV area, measures it beside the
guest's DRAM, labels the figures emulated (a QEMU guest) and never compares them with the manifest's
`pool.expect`; and that no byte of the KV area changed (checked in the pool's backing file).

What it does not prove: any figure. TCG emulates neither caches nor CXL latency; the numbers are the
emulator's and mean nothing for hardware (docs/pool-speed.md).

Slow (one CLI run in a TCG guest); marked `lab`. Run:
    .venv/bin/pytest -m lab -s tests/lab/test_bench_pool_lab.py
"""

from __future__ import annotations

import hashlib
import json

import pytest

from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from tests.support.lab import REPO
from tests.support.pmem_pair import MANIFEST, PmemPair

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

DAX_BASE = 2 << 20  # byte 0 of /dev/dax0.0 in the pool file (map=mem namespace, docs/lab.md)
GUEST_SHARE = "/run/belugactl-lab/share"
EXPECT = "  expect: {load_latency_ns: 750, read_gbps_per_device: 22.5, write_gbps_per_device: 20}\n"


def _kv_digest(pair: PmemPair, offset: int, size: int) -> str:
    with open(pair.pool_file, "rb") as f:
        f.seek(DAX_BASE + offset)
        return hashlib.sha256(f.read(size)).hexdigest()


def test_bench_pool_reads_the_lab_devdax_labels_it_emulated_and_writes_nothing(pmem_pair: PmemPair) -> None:
    text = (REPO / MANIFEST).read_text()
    assert "  align: 2MiB\n" in text
    (pmem_pair.share("lab-1") / "lab-expect.yaml").write_text(
        text.replace("  align: 2MiB\n", "  align: 2MiB\n" + EXPECT, 1)
    )
    kv = resolve_layout(load_manifest(REPO / MANIFEST)).shared_kv
    before = _kv_digest(pmem_pair, kv.offset, 16 << 20)

    manifest = f"{GUEST_SHARE}/lab-expect.yaml"
    flags = ("--read-only", "--threads", "1,2", "--size", "4MiB", "--repeat", "1", "--json")
    run = pmem_pair.sh("lab-1", "belugactl", "bench", "pool", "-f", manifest, "--host", "lab-1", *flags)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    print(json.dumps({k: doc[k] for k in ("pool", "rows", "expect")}, indent=1))
    pool = doc["pool"]
    assert pool["path"] == "/dev/dax0.0" and pool["kind"] == "devdax"
    assert pool["emulated"] is True and ("QEMU" in pool["emulated_why"] or "virtual" in pool["emulated_why"])
    assert pool["access"] == {"mode": "read-only", "offset": kv.offset, "length": kv.size,
                              "area": "the shared KV area (read only)"}  # fmt: skip
    assert [(r["region"], r["threads"]) for r in doc["rows"]] == [("dram", 1), ("device 0", 1), ("dram", 2),
                                                                  ("device 0", 2)]  # fmt: skip
    assert doc["interleave"]["source"].startswith("sysfs region") and doc["interleave"]["ways"] == 1
    assert doc["regions"][0]["memdev"] == "mem0"  # the region's one memdev, from sysfs
    device = doc["rows"][1]
    assert device["load_latency_ns"] > 0 and device["read_gb_per_s"] > 0 and device["write_nt_gb_per_s"] is None
    assert doc["latency_method"].startswith("hashed chase")
    assert {v["status"] for v in doc["expect"]} == {"skip"}  # emulated: shown, never compared
    assert all("emulated" in v["reason"] for v in doc["expect"])
    assert _kv_digest(pmem_pair, kv.offset, 16 << 20) == before
