"""A metadata-server standby in one lab guest takes over from the leader in another (issue 32).

Two guests share the CXL device (the `pmem_pair`, tests/support/pmem_pair.py); a real etcd runs
here on loopback and the guests reach it through QEMU's user network (`lab up --host-port`: a
guest dials 10.0.2.100:PORT, QEMU connects to 127.0.0.1:PORT; nothing else leaves a guest). lab-1's
server wins the election and serves; lab-2's stands by with a warm copy. lab-2 saves blocks through
its own ring, the leader is SIGKILLed, and lab-2's standby must take over the same rings with the
index intact: a client on lab-1's ring then finds every block and reads the right bytes through
the server that now runs in the other guest. Then lab-1 stands by again and lab-2's whole guest is
frozen (its QEMU stopped): lab-1 takes over; lab-2 is thawed with its old leader still running, a
zombie whose deadline has long passed, which must step down without writing while lab-1 serves the
same blocks to both rings.

What this proves: the election, the fencing epoch and the journal in the pool work between two
kernels sharing one device, and CXL-RPC clients need no new address after a failover. What it does
not: timings (TCG), coherence (TCG has no caches). Slow; marked `lab`. Run:
    .venv/bin/pytest -m lab -s tests/dataplane/test_failover_lab.py
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

import pytest

from belugactl.lab.qemu import HOST_ALIAS
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from tests.support.etcd import running_etcd
from tests.support.lab import REPO
from tests.support.lab_scripts import LAUNCH, WAIT_READY
from tests.support.pmem_pair import PmemPair

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

MANIFEST = "examples/lab.yaml"
DAX = "/dev/dax0.0"
GUEST_SHARE = "/run/belugactl-lab/share"
NAMESPACE = "failover-lab"
BLOCKS = {"small": 12288, "mib": 1 << 20}
ADMIN_PORT = 9470  # examples/lab.yaml serve.metadata
LOG = "failover-mds.log"


def _events(pair: PmemPair, host: str) -> list[dict[str, Any]]:
    path = pair.share(host) / LOG
    text = path.read_text(errors="replace") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"event"')]


def _log(pair: PmemPair, host: str) -> str:
    path = pair.share(host) / LOG
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _wait_event(pair: PmemPair, host: str, name: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in _events(pair, host) if e["event"] == name]
        if found:
            return found[-1]
        time.sleep(1)
    raise AssertionError(f"{host}: no {name!r} event within {timeout_s} s:\n{_log(pair, host)}")


def _await_leader(pair: PmemPair, host: str) -> tuple[dict[str, Any], float]:
    """Wait for `host`'s server to answer /readyz 200 (it leads); its start record, and the wait."""
    t0 = time.monotonic()
    ready = pair.sh(host, sys.executable, "-c", WAIT_READY, f"http://127.0.0.1:{ADMIN_PORT}/readyz", "240",
                    timeout=300)  # fmt: skip
    assert ready.returncode == 0, f"{host} never led: {ready.stdout}\n{_log(pair, host)}"
    waited = time.monotonic() - t0
    return _wait_event(pair, host, "started", 30), waited


def _launch(pair: PmemPair, host: str, etcd_port: int) -> int:
    start = pair.sh(host, sys.executable, "-c", LAUNCH, f"{GUEST_SHARE}/{LOG}", f"{GUEST_SHARE}/failover-mds.pid",
                    sys.executable, "-m", "belugactl", "metadata-server", "-f", MANIFEST, "--pool", DAX, "--standby",
                    "--etcd", f"http://{HOST_ALIAS}:{etcd_port}", "--member", host, "--leader-ttl", "5",
                    "--fence-grace", "1", "--json", timeout=120)  # fmt: skip
    assert start.returncode == 0, start.stderr
    return int(start.stdout.strip())


def _drive(pair: PmemPair, host: str, action: str, ring: int, seed: int) -> dict[str, Any]:
    blocks = [f"--block={name}:{n}" for name, n in BLOCKS.items()]
    r = pair.sh(host, sys.executable, "-m", "belugactl.lab.guest.rpc_driver", action, "--pool", DAX, "--ring",
                str(ring), "--namespace", NAMESPACE, "--seed", str(seed), "--pings", "2", "--timeout", "30",
                *blocks, timeout=300)  # fmt: skip
    assert r.stdout.strip(), f"{host} driver printed nothing (exit {r.returncode}):\n{r.stderr[-3000:]}"
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and doc["ok"], f"{host} {action} failed: {json.dumps(doc)[:3000]}\n{r.stderr[-2000:]}"
    return doc


def test_a_standby_in_lab2_takes_over_lab1s_rings_with_the_index(pmem_pair: PmemPair) -> None:
    pair = pmem_pair
    layout = resolve_layout(load_manifest(REPO / MANIFEST))
    ring1, ring2 = layout.ring_for("lab-1", 0), layout.ring_for("lab-2", 0)
    seed = random.randrange(1 << 31)
    for host in ("lab-1", "lab-2"):
        (pair.share(host) / LOG).unlink(missing_ok=True)
    pids: dict[str, int] = {}
    frozen: list[int] = []  # lab-2's QEMU while it is stopped
    timings: dict[str, float] = {}
    with running_etcd(pair.etcd_port):
        try:
            t0 = time.monotonic()
            pids["lab-1"] = _launch(pair, "lab-1", pair.etcd_port)
            leader, _ = _await_leader(pair, "lab-1")
            timings["lab-1 launch to leading"] = time.monotonic() - t0

            t0 = time.monotonic()
            pids["lab-2"] = _launch(pair, "lab-2", pair.etcd_port)
            _wait_event(pair, "lab-2", "standby", 240)
            timings["lab-2 launch to standing by"] = time.monotonic() - t0

            put = _drive(pair, "lab-2", "put", ring2, seed)
            assert put["epoch"] == leader["epoch"] and put["lookup_prefix"] == len(BLOCKS)

            # The leader dies without a word; its lease lapses and lab-2 campaigns, fences, serves.
            killed = pair.sh("lab-1", "kill", "-KILL", str(pids.pop("lab-1")), timeout=60)
            assert killed.returncode == 0, killed.stderr
            took_over, timings["leader killed to lab-2 ready (TCG)"] = _await_leader(pair, "lab-2")
            assert took_over["epoch"] > leader["epoch"], (leader, took_over)

            # lab-1's own ring, now answered by the server in lab-2: every block, the right bytes.
            got = _drive(pair, "lab-1", "check", ring1, seed)
            assert got["epoch"] == took_over["epoch"] and got["lookup_prefix"] == len(BLOCKS)
            assert [b["name"] for b in got["blocks"]] == list(BLOCKS) and all(b["ok"] for b in got["blocks"])

            # Now the leader's whole host stops without a word (its QEMU frozen: no FIN, no keepalive,
            # its kernel's clock stopped): a standby that lab-1 started meanwhile takes over. Then the
            # host comes back with the old leader still running, its deadline long past (the zombie
            # leader): it must step down without writing, and lab-1 keeps serving the same blocks.
            (pair.share("lab-1") / LOG).unlink(missing_ok=True)
            pids["lab-1"] = _launch(pair, "lab-1", pair.etcd_port)
            _wait_event(pair, "lab-1", "standby", 240)
            frozen.append(int((pair.lab_dir / "guests" / "lab-2" / "qemu.pid").read_text()))
            os.kill(frozen[0], signal.SIGSTOP)
            third, timings["lab-2's guest frozen to lab-1 ready (TCG)"] = _await_leader(pair, "lab-1")
            assert third["epoch"] > took_over["epoch"], (took_over, third)
            t0 = time.monotonic()
            os.kill(frozen.pop(), signal.SIGCONT)
            stepped = _wait_event(pair, "lab-2", "stepped-down", 120)
            timings["lab-2 thawed to stepped down (TCG)"] = time.monotonic() - t0
            assert stepped["epoch"] == took_over["epoch"], (stepped, took_over)
            got = _drive(pair, "lab-1", "check", ring1, seed)
            assert got["epoch"] == third["epoch"] and all(b["ok"] for b in got["blocks"])
            again = _drive(pair, "lab-2", "check", ring2, seed)
            assert again["epoch"] == third["epoch"] and all(b["ok"] for b in again["blocks"])
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            for host, pid in pids.items():
                pair.sh(host, "sh", "-c", f"kill -KILL {pid} 2>/dev/null; true", timeout=60)
            print("\nfailover lab timings [TCG]: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))

