"""CXL-RPC between two lab guests over the shared pool: the metadata server in lab-1, clients in both.

What this proves: the layout's offsets and the slot protocol hold across hosts. lab-2 talks to the
server in lab-1 only through its own ring in the pool's metadata area (cxl:///dev/dax0.0#<ring of
lab-2>), reserves blocks, writes their bytes into the returned extents through its own mapping and
commits; a client on lab-1's ring then finds and reads them, and this process finds the same bytes
(and lab-2's slot headers, and the server's epoch) in the pool's backing file at the layout's offset
plus 2 MiB (byte 0 of /dev/dax0.0 is byte 2 MiB of the file). The same lookups also go over TCP
inside lab-1.

What it does not prove: coherence. QEMU's TCG emulates no CPU caches, so a store is visible to the
other guest at once whether or not the code flushes; the flush paths are reasoned about and
unit-tested elsewhere. Latencies printed here are TCG's and mean nothing for hardware.

Slow (a 2-guest lab, `belugactl setup` in each guest: the `pmem_pair` that tests/setup/test_setup_lab.py
then checks and tears down, tests/support/pmem_pair.py); marked `lab`. Fails in CI (CI=true) and is
skipped elsewhere when the lab's prerequisites are missing. Run:
    .venv/bin/pytest -m lab -s tests/dataplane/test_rpc_lab.py
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from belugactl.dataplane.rpc.protocol import HEADER, MAGIC
from belugactl.lab.guest.rpc_driver import block_bytes
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from belugactl.pool.header import EPOCH_OFFSET
from tests.support.lab import REPO
from tests.support.lab_scripts import LAUNCH, WAIT_EXIT, WAIT_READY
from tests.support.pmem_pair import PmemPair

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

MANIFEST = "examples/lab.yaml"
DAX = "/dev/dax0.0"
DAX_BASE = 2 << 20  # byte 0 of /dev/dax0.0 in the pool file (map=mem namespace, docs/lab.md)
GUEST_SHARE = "/run/belugactl-lab/share"
NAMESPACE = "rpc-lab"
# Sizes chosen to land in different allocator classes (4 KiB multiple, 1 MiB, above one 2 MiB chunk).
BLOCKS = {"small": 12288, "mib": 1 << 20, "big": (5 << 19) + 4096}
ADMIN_PORT = 9470  # examples/lab.yaml serve.metadata
RPC_PORT = 9471

@dataclass
class Rack:
    pair: PmemPair
    server_pid: int
    epoch: int
    ready: dict[str, Any]
    seed: int
    timings: dict[str, float]

    @property
    def pool_file(self) -> Path:
        return self.pair.pool_file

    def sh(self, host: str, *argv: str, timeout: float = 240) -> Any:
        return self.pair.sh(host, *argv, timeout=timeout)

    def share(self, host: str) -> Path:
        return self.pair.share(host)

    def server_log(self) -> str:
        path = self.share("lab-1") / "rpc-mds.log"
        return path.read_text(errors="replace") if path.exists() else "(no server log)"

    def drive(self, host: str, action: str, *extra: str) -> dict[str, Any]:
        """Run the RPC driver (lab/guest/rpc_driver.py) in a guest (rings come from the host's layout:
        no manifest to load there, which saves seconds of Python imports per run under TCG)."""
        blocks = [f"--block={name}:{n}" for name, n in BLOCKS.items()]
        t0 = time.monotonic()
        r = self.sh(host, sys.executable, "-m", "belugactl.lab.guest.rpc_driver", action, "--pool", DAX,
                    "--namespace", NAMESPACE, "--seed", str(self.seed), *blocks, *extra)  # fmt: skip
        self.timings[f"{host} {action} {' '.join(extra)}"] = time.monotonic() - t0
        assert r.stdout.strip(), f"{host} driver printed nothing (exit {r.returncode}):\n{r.stderr[-3000:]}"
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0 and doc["ok"], (
            f"{host} {action} failed: {json.dumps(doc)[:4000]}\nstderr: {r.stderr[-2000:]}\n"
            f"server log:\n{self.server_log()[-3000:]}"
        )
        return doc


def _layout():
    return resolve_layout(load_manifest(REPO / MANIFEST))


@pytest.fixture(scope="module")
def rack(pmem_pair: PmemPair) -> Iterator[Rack]:
    # The pair comes set up (tests/support/pmem_pair.py): lab-1 first (region, namespace, header), then
    # lab-2, which verified the header lab-1 wrote.
    timings = dict(pmem_pair.seconds)
    rack = Rack(pmem_pair, 0, 0, {}, random.randrange(1 << 31), timings)
    try:
        # The exec channel needs no network; the admin HTTP and TCP RPC need loopback up in lab-1.
        lo = rack.sh("lab-1", "ip", "link", "set", "lo", "up")
        assert lo.returncode == 0, lo.stderr
        t0 = time.monotonic()
        log, pidfile = f"{GUEST_SHARE}/rpc-mds.log", f"{GUEST_SHARE}/rpc-mds.pid"
        # `python -m belugactl`, not the console script: the code under test, whatever is installed.
        start = rack.sh("lab-1", sys.executable, "-c", LAUNCH, log, pidfile, sys.executable, "-m", "belugactl",
                        "metadata-server", "-f", MANIFEST, "--pool", DAX, "--fence-grace", "1", "--json")  # fmt: skip
        assert start.returncode == 0, start.stderr
        rack.server_pid = int(start.stdout.strip())
        ready = rack.sh("lab-1", sys.executable, "-c", WAIT_READY, f"http://127.0.0.1:{ADMIN_PORT}/readyz", "150")
        assert ready.returncode == 0, f"server never ready: {ready.stdout}\n{rack.server_log()[-3000:]}"
        timings["server launch to ready"] = time.monotonic() - t0
        rack.ready = json.loads(ready.stdout)["body"]
        started = [json.loads(line) for line in rack.server_log().splitlines() if line.startswith('{"event"')]
        assert started and started[0]["event"] == "started", rack.server_log()[-3000:]
        rack.epoch = started[0]["epoch"]
        yield rack
    finally:
        # The pair's next users (test_setup_lab) need lab-1 without a server, whatever happened here.
        if rack.server_pid:
            rack.sh("lab-1", "sh", "-c", f"kill -KILL {rack.server_pid} 2>/dev/null; true")
        print("\nrpc lab timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


def _print_latencies(label: str, doc: dict[str, Any]) -> None:
    parts = [f"{op} {s['median']:.2f} ms (min {s['min']:.2f}, max {s['max']:.2f}, n={s['n']})"
             for op, s in doc["latency_ms"].items()]  # fmt: skip
    print(f"\n{label} [TCG, not hardware]: connect {doc['connect_ms']:.1f} ms; " + "; ".join(parts)
          + f" | driver ran {doc['run_s']:.1f} s of a {doc['process_age_s']} s process")  # fmt: skip


def test_server_in_lab1_serves_cxl_rpc_over_the_pool(rack: Rack) -> None:
    assert rack.ready["ready"] is True and rack.ready["epoch"] == rack.epoch >= 1, rack.ready
    # The epoch the server bumped is in the pool header, where the layout puts it, seen from here.
    with rack.pool_file.open("rb") as f:
        f.seek(DAX_BASE + EPOCH_OFFSET)
        assert int.from_bytes(f.read(8), "little") == rack.epoch


def test_lab2_puts_over_its_ring_and_lab1_reads_the_bytes(rack: Rack) -> None:
    layout = _layout()
    ring1, ring2 = layout.ring_for("lab-1", 0), layout.ring_for("lab-2", 0)
    assert ring1 != ring2

    put = rack.drive("lab-2", "put", "--ring", str(ring2))
    assert put["hostname"] == "lab-2" and put["ring"] == ring2 and put["address"] == f"cxl://{DAX}#{ring2}"
    assert put["epoch"] == rack.epoch and put["lookup_prefix"] == len(BLOCKS)
    assert put["needs_flush"] is True  # a write-back devdax pool shared by two hosts
    assert [b["name"] for b in put["blocks"]] == list(BLOCKS) and all(b["ok"] for b in put["blocks"])
    for reserved, got in zip(put["put"], put["blocks"], strict=True):
        assert reserved["reserved_extents"] == got["extents"]  # get returns what reserve handed out
    _print_latencies("lab-2 -> lab-1 over CXL-RPC", put)

    # The block bytes are in the pool file at extent offset + 2 MiB (where the layout says).
    kv = (layout.shared_kv.offset, layout.shared_kv.offset + layout.shared_kv.size)
    with rack.pool_file.open("rb") as f:
        for block in put["blocks"]:
            data = bytearray()
            for off, length in block["extents"]:
                assert kv[0] <= off and off + length <= kv[1], (block, kv)
                f.seek(DAX_BASE + off)
                data += f.read(min(length, block["nbytes"] - len(data)))
            assert bytes(data) == block_bytes(rack.seed, block["name"], BLOCKS[block["name"]]), block["name"]

        # lab-2's slot headers (the server's replies) are in the pool file at the layout's ring offset.
        rpc = layout.rpc
        assert put["slots"], "lab-2 saw no message in its ring"
        for slot in put["slots"]:
            assert slot["offset"] == rpc.offset + ring2 * rpc.ring_stride + slot["slot"] * rpc.slot_size
            f.seek(DAX_BASE + slot["offset"])
            status, seq, magic, epoch, op, code, length = HEADER.unpack(f.read(HEADER.size))
            assert (magic, seq, epoch, op) == (MAGIC, slot["seq"], rack.epoch & 0xFFFFFFFF, slot["op"]), slot
            assert seq % rpc.slots_per_ring == slot["slot"]

    # A second client, on lab-1's own ring, finds what lab-2 wrote and reads the same bytes.
    check = rack.drive("lab-1", "check", "--ring", str(ring1))
    assert check["hostname"] == "lab-1" and check["ring"] == ring1 and check["lookup_prefix"] == len(BLOCKS)
    seen = [(b["extents"], b["sha256"]) for b in check["blocks"]]
    assert seen == [(b["extents"], b["sha256"]) for b in put["blocks"]]
    _print_latencies("lab-1 -> lab-1 over CXL-RPC", check)

    # lab-2 again (a new client on the same ring: HELLO at slot 0 re-joins it) still sees them.
    again = rack.drive("lab-2", "check", "--ring", str(ring2), "--pings", "0")
    assert again["lookup_prefix"] == len(BLOCKS)


def test_same_lookups_over_tcp_in_lab1(rack: Rack) -> None:
    doc = rack.drive("lab-1", "check", "--address", f"tcp://127.0.0.1:{RPC_PORT}")
    assert doc["address"].startswith("tcp://") and doc["lookup_prefix"] == len(BLOCKS)
    assert all(b["ok"] for b in doc["blocks"])
    _print_latencies("lab-1 -> lab-1 over TCP (loopback)", doc)


def test_server_stops_gracefully_on_sigterm(rack: Rack) -> None:
    kill = rack.sh("lab-1", "kill", "-TERM", str(rack.server_pid))
    assert kill.returncode == 0, kill.stderr
    gone = rack.sh("lab-1", sys.executable, "-c", WAIT_EXIT, str(rack.server_pid), "60")
    assert gone.returncode == 0, f"server {rack.server_pid} still running 60 s after SIGTERM"
    assert rack.server_log().rstrip().endswith("metadata server: stopped"), rack.server_log()[-2000:]
