"""setup / teardown on the emulated rack: real kernel 6.1, real cxl/ndctl/daxctl 76.1, two guests, one pool.

Slow (each command in a TCG guest takes tens of seconds); marked `lab`. Runs on the `pmem_pair`
(tests/support/pmem_pair.py): its guests and first setups, which tests/dataplane/test_rpc_lab.py
has used just before; the teardown at the end makes it their last user.
Run: .venv/bin/pytest -m lab tests/setup/test_setup_lab.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pmem_pair import MANIFEST, PmemPair

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def setup(lab: PmemPair, host: str, *extra: str, manifest: str = MANIFEST) -> subprocess.CompletedProcess[str]:
    return lab.setup(host, *extra, manifest=manifest)


PATTERN = """
import mmap, os, sys
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
layout = resolve_layout(load_manifest("examples/lab.yaml"))
part = layout.partition_for("lab-1")
fd = os.open("/dev/dax0.0", os.O_RDWR)
m = mmap.mmap(fd, part.offset + (2 << 20), mmap.MAP_SHARED)
if sys.argv[1] == "write":
    m[part.offset:part.offset + 16] = b"lab-1 was here!!"
print(bytes(m[part.offset:part.offset + 16]).decode(errors="replace"))
"""


def test_two_hosts_setup_share_verify_and_teardown(pmem_pair: PmemPair) -> None:
    lab = pmem_pair
    # lab-1 first: it created region + namespace and wrote the header (the pair's first setups,
    # tests/support/pmem_pair.py; test_rpc_lab's server has run on the pool since, and has stopped).
    first = lab.first_setup["lab-1"]
    fresh_s = lab.seconds["setup lab-1"]
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    applied = [a["step"]["id"] for a in report["applied"]]
    assert applied[:4] == ["region.create", "devdax.create", "permissions.dax", "header.write"], applied
    assert "wrote the header" in report["applied"][3]["detail"]

    # lab-2 verified the header lab-1 wrote (no header step applied).
    second = lab.first_setup["lab-2"]
    assert second.returncode == 0, second.stderr
    ids = [a["step"]["id"] for a in json.loads(second.stdout)["applied"]]
    assert "region.create" in ids and "header.write" not in ids

    # A second run on each host: zero steps.
    for host in ("lab-1", "lab-2"):
        t0 = time.monotonic()
        again = setup(lab, host)
        assert again.returncode == 0, again.stderr
        doc = json.loads(again.stdout)
        assert doc["applied"] == [] and doc["plan"]["converged"], doc
        print(f"{host}: no-op rerun {time.monotonic() - t0:.1f} s wall through lab exec, "
              f"{doc['duration_s']:.2f} s inside setup; fresh setup of lab-1 {fresh_s:.1f} s wall")

    # doctor passes on both, the namespace's label uuid (sysfs) being the pinned one.
    for host in ("lab-1", "lab-2"):
        doctor = lab.sh(host, "belugactl", "doctor", "--json", "-f", MANIFEST, "--host", host)
        assert doctor.returncode == 0, doctor.stdout[-3000:]
        statuses = {c["id"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
        assert statuses["dax.namespace-uuid"] == "ok", statuses

    # A pattern lab-1 writes at its partition offset is read by lab-2.
    wrote = lab.sh("lab-1", sys.executable, "-c", PATTERN, "write")
    assert wrote.returncode == 0 and "lab-1 was here!!" in wrote.stdout, wrote.stderr
    read = lab.sh("lab-2", sys.executable, "-c", PATTERN, "read")
    assert read.returncode == 0 and "lab-1 was here!!" in read.stdout, read.stderr

    # lab-2 with a manifest whose layout differs: refused with the diff, the data intact.
    changed = lab.share("lab-2") / "changed.yaml"
    changed.write_text((REPO / MANIFEST).read_text().replace("slots_per_ring: 64", "slots_per_ring: 128"))
    refused = setup(lab, "lab-2", manifest="/run/belugactl-lab/share/changed.yaml")
    assert refused.returncode == 1
    assert "rpc_slots_per_ring: manifest 128, pool 64" in refused.stderr
    assert "lab-1 was here!!" in lab.sh("lab-2", sys.executable, "-c", PATTERN, "read").stdout

    # MTRR entries added for an uncachable pool, and removed by teardown.
    unc = lab.share("lab-1") / "uncachable.yaml"
    unc.write_text((REPO / MANIFEST).read_text().replace("pool_memory_type: write-back",
                                                         "pool_memory_type: uncachable"))
    before = lab.sh("lab-1", "cat", "/proc/mtrr").stdout
    added = setup(lab, "lab-1", "--only", "mtrr", manifest="/run/belugactl-lab/share/uncachable.yaml")
    assert added.returncode == 0, added.stderr
    during = lab.sh("lab-1", "cat", "/proc/mtrr").stdout
    assert during.count("uncachable") > before.count("uncachable")

    # Teardown: refused without --force, then leaves lab-1 as before setup.
    no_force = lab.sh("lab-1", "belugactl", "teardown", "-f", "/run/belugactl-lab/share/uncachable.yaml",
                      "--host", "lab-1")
    assert no_force.returncode == 1 and "--force" in no_force.stderr
    down = lab.sh("lab-1", "belugactl", "teardown", "-f", "/run/belugactl-lab/share/uncachable.yaml",
                  "--host", "lab-1", "--force", "--yes")
    assert down.returncode == 0, down.stderr
    assert lab.sh("lab-1", "cat", "/proc/mtrr").stdout == before
    listing = lab.sh("lab-1", "sh", "-c", "cxl list -R; ndctl list -N; ls /etc/udev/rules.d 2>/dev/null").stdout
    assert "region" not in listing and "namespace" not in listing and "belugactl" not in listing
