"""Poison injected through QEMU's monitor reaches the guest kernel, doctor, the metadata server and a
reader (issue 33 item 4), in one ram-profile guest (QEMU 10, kernel 6.12, ndctl 81).

Why not the shared pmem lab (tests/support/pmem_pair.py): its QEMU is Debian 12's 7.2, whose QMP has
no CXL error injection at all (tests/lab/test_qmp.py shows CommandNotFound), so this test boots a
guest of its own.

1. `lab up` one ram guest (two volatile type-3 devices behind a switch), `setup` the pool's topics
   with examples/lab-ram.yaml plus `serve.metadata.poison_check_s: 3`.
2. In the guest: the metadata server on /dev/dax0.0, 8 blocks of 64 KiB stored over TCP.
3. Here: `cxl-inject-poison` on the device and device physical address that hold a line inside block
   3 (the region interleaves 2 ways at 4 KiB, devices in serial order: region offset = pool offset).
4. In the guest: the server's own periodic check (`cxl list -R -L`) finds it, quarantines the chunk
   and drops block 3 (a "deleted" removal); a reader gets a miss for it and the other 7 blocks. Then,
   with the server stopped (two `cxl list -L` at once can take each other's trace events), doctor
   fails `cxl.media-errors` naming the pool range.
Without the ram profile's Debian packages the test fails in CI (CI=true) and is skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from belugactl.lab import prereqs
from belugactl.lab.paths import STATE_ENV
from belugactl.lab.qmp import qmp_command
from tests.support.lab import REPO, our_qemus, run_cli, unavailable

pytestmark = [pytest.mark.lab, pytest.mark.lab_ram, pytest.mark.timeout(900)]

LAB = "pytest-poison"
GUEST_SHARE = "/run/belugactl-lab/share"
GRANULE, WAYS = 4096, 2  # examples/lab-ram.yaml: hardware interleave over the two devices
VICTIM = 3
SERVE = """
serve:
  metadata:
    host: lab-1
    poison_check_s: 3
  vllm:
    model: /opt/models/tiny-llama
    gpus_per_instance: 0
"""

# In the guest: start the server detached (it outlives `lab exec`), wait for /readyz, store the blocks.
SERVE_AND_PUT = r"""
import json, subprocess, sys, time, urllib.request
from belugactl.dataplane import native
from belugactl.dataplane.client import connect
share, manifest = sys.argv[1], sys.argv[2]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
log = open(f"{share}/mds.log", "wb")
p = subprocess.Popen([sys.executable, "-m", "belugactl", "metadata-server", "-f", manifest, "--host", "lab-1",
                      "--pool", "/dev/dax0.0", "--fence-grace", "0", "--json"], stdin=subprocess.DEVNULL,
                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
deadline = time.monotonic() + 240
while True:
    try:
        with urllib.request.urlopen("http://127.0.0.1:9470/readyz", timeout=10) as r:
            if r.status == 200:
                break
    except Exception:
        if time.monotonic() > deadline or p.poll() is not None:
            print(json.dumps({"error": "the server never got ready"})); sys.exit(1)
    time.sleep(0.5)
c = connect("tcp://127.0.0.1:9471", timeout_s=60)
extents = []
for i in range(8):
    r = c.reserve("poison-lab", bytes([i + 1]) * 32, 64 << 10)
    c.commit(r.token, native.crc32c(bytes(64 << 10)))
    extents.append([list(e) for e in r.extents])
print(json.dumps({"pid": p.pid, "extents": extents}))
"""

# In the guest, after the injection: wait for the server's own check to drop a block, read every
# block, stop the server, run doctor.
CHECK = r"""
import json, os, signal, subprocess, sys, time, urllib.request
from belugactl.dataplane.client import connect
manifest, pid = sys.argv[1], int(sys.argv[2])
def stats():
    with urllib.request.urlopen("http://127.0.0.1:9470/stats", timeout=30) as r:
        return json.loads(r.read())
deadline = time.monotonic() + 180
while stats()["poison"]["blocks_dropped"] < 1 and time.monotonic() < deadline:
    time.sleep(1)
c = connect("tcp://127.0.0.1:9471", timeout_s=60)
found = []
for i in range(8):
    loc = c.get("poison-lab", bytes([i + 1]) * 32)
    found.append(loc is not None)
    if loc is not None:
        c.release([loc.lease_id])
removed = [[r.key.hex(), r.why] for r in c.removals_since(0, "poison-lab").items]
poison = stats()["poison"]
c.close()
os.kill(pid, signal.SIGTERM)
for _ in range(120):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
doc = subprocess.run([sys.executable, "-m", "belugactl", "doctor", "-f", manifest, "--host", "lab-1", "--json"],
                     capture_output=True, text=True, timeout=400)
checks = {c["id"]: c for c in json.loads(doc.stdout)["checks"]}
print(json.dumps({"found": found, "removed": removed, "poison": poison, "doctor": checks["cxl.media-errors"]}))
"""


def _guest_json(env: dict[str, str], script: Path, *args: str, timeout: float) -> dict:
    argv = ["env", f"PYTHONPATH={REPO}", sys.executable, f"{GUEST_SHARE}/{script.name}", *args]
    r = run_cli(env, "lab", "exec", "--name", LAB, "--timeout", str(timeout), "lab-1", "--", *argv,
                timeout=timeout + 60)  # fmt: skip
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines, f"{script.name}: exit {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return json.loads(lines[-1])


def _device_line(pool_offset: int) -> tuple[str, int]:
    """The type-3 device (QOM path) and device physical address holding a pool byte: the ram region's
    dax device starts at region offset 0; positions follow serials, cxl-vmem0 first."""
    granule = pool_offset // GRANULE
    return f"/machine/peripheral/cxl-vmem{granule % WAYS}", granule // WAYS * GRANULE + pool_offset % GRANULE


def test_poison_injected_by_qmp_is_seen_by_doctor_and_the_server_and_a_reader_misses(tmp_path: Path) -> None:
    if prereqs.find_program("busybox") is None:
        unavailable("busybox not found (Debian package busybox-static)")
    seconds: dict[str, float] = {}
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"bp{os.getpid()}"  # short: the QMP socket path
    env = dict(os.environ, **{STATE_ENV: str(state)})
    t0 = time.monotonic()
    prep = run_cli(env, "lab", "prepare", "--profile", "ram", "--json", timeout=900)
    if prep.returncode != 0:
        unavailable(f"`belugactl lab prepare --profile ram` failed: {prep.stderr.strip()[-500:]}")
    try:
        t0 = time.monotonic()
        up = run_cli(env, "lab", "up", "--name", LAB, "--profile", "ram", "--count", "1", "--json", timeout=400)
        assert up.returncode == 0, f"lab up failed:\n{up.stderr[-3000:]}"
        seconds["lab up"] = time.monotonic() - t0
        guest = json.loads(up.stdout)["lab"]["guests"][0]
        share, qmp = Path(guest["share"]), Path(guest["spool"]).parent / "qmp.sock"
        assert qmp.exists(), f"no QMP socket at {qmp}"
        manifest = share / "rack.yaml"
        manifest.write_text((REPO / "examples" / "lab-ram.yaml").read_text() + SERVE)
        (share / "serve_and_put.py").write_text(SERVE_AND_PUT)
        (share / "check.py").write_text(CHECK)
        guest_manifest = f"{GUEST_SHARE}/rack.yaml"

        t0 = time.monotonic()
        setup = run_cli(env, "lab", "exec", "--name", LAB, "--timeout", "400", "lab-1", "--", "env",
                        f"PYTHONPATH={REPO}", sys.executable, "-m", "belugactl", "setup", "-f", guest_manifest,
                        "--host", "lab-1", "--only", "autoonline,region,devdax,header", "--json",
                        timeout=460)  # fmt: skip
        assert setup.returncode == 0, f"setup failed:\n{setup.stdout[-2000:]}\n{setup.stderr[-3000:]}"
        seconds["setup"] = time.monotonic() - t0

        t0 = time.monotonic()
        put = _guest_json(env, share / "serve_and_put.py", GUEST_SHARE, guest_manifest, timeout=400)
        seconds["server start and 8 saves"] = time.monotonic() - t0
        victim = put["extents"][VICTIM][0][0] + GRANULE  # a line inside block 3's bytes
        device, dpa = _device_line(victim)
        assert qmp_command(qmp, "cxl-inject-poison", {"path": device, "start": dpa, "length": 64}) == {}

        t0 = time.monotonic()
        got = _guest_json(env, share / "check.py", guest_manifest, str(put["pid"]), timeout=700)
        seconds["server drop, reads, doctor"] = time.monotonic() - t0
        print(f"\npoison lab: {', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}")
        log = (share / "mds.log").read_text(errors="replace")[-3000:]

        # The server read the device's poison list itself, quarantined the chunk, dropped block 3 only.
        poison = got["poison"]
        assert poison["blocks_dropped"] == 1 and poison["chunks_quarantined"] >= 1, (poison, log)
        assert poison["checks"] >= 1 and poison["last_check"]["read"], poison
        assert got["found"] == [i != VICTIM for i in range(8)], got  # a reader misses it, not the bytes
        assert got["removed"] == [[(bytes([VICTIM + 1]) * 32).hex(), "deleted"]]  # the connector's KV event

        # Doctor in the guest fails cxl.media-errors naming the pool range the kernel placed.
        check = got["doctor"]
        ranges = check["details"].get("poisoned_pool_ranges", [])
        assert check["status"] == "fail", check
        assert {"offset": victim, "length": 64} in [{"offset": r["offset"], "length": r["length"]} for r in ranges]
        assert f"0x{victim:x}+64" in check["reason"], check["reason"]
    finally:
        run_cli(env, "lab", "down", "--name", LAB, timeout=120)
        for pid in our_qemus(state):  # last resort, still only our own QEMU processes
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)
