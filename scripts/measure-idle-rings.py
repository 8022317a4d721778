#!/usr/bin/env python3
"""Idle CPU of the metadata server polling many CXL-RPC rings (nobody sends anything).

A rack of HOSTS hosts x INSTANCES instances x (1 scheduler + TP workers) rings on a file pool:
starts `belugactl metadata-server` on it, lets it settle, and reads the server's CPU time from
/proc over a window. With the defaults, 16 hosts x 8 instances x (scheduler + 1 worker) = 256
process rings + 16 spare, as examples/beluga-rack.yaml lays them out (256 slots per ring).

    PYTHONPATH=. python scripts/measure-idle-rings.py [--hosts 16] [--instances 8] [--tp 1] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RACK = """\
version: 1
name: idle-rings
pool:
  source: {{kind: dax-device, device: dax0.0}}
  size: 1GiB
  align: 2MiB
layout:
  metadata: {{slots_per_ring: {slots}, slot_size: 256B, spare_rings: 16, journal: 4MiB}}
  shared_kv: 50%
  partition_size: equal
hosts:
{hosts}serve:
  vllm:
    model: org/model
    instances_per_host: {instances}
    gpus_per_instance: {tp}
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record_native() -> bool:
    from belugactl.dataplane import native

    return bool(native.AVAILABLE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=2.0)
    args = ap.parse_args()
    hosts = "".join(
        f"  - name: h{i:02d}\n    address: 10.0.0.{i + 1}\n    roles: [{'metadata, ' if i == 0 else ''}worker]\n"
        f"    gpus: {{count: {args.instances * args.tp}}}\n"
        for i in range(args.hosts)
    )
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "rack.yaml"
        manifest.write_text(
            RACK.format(slots=args.slots, hosts=hosts, instances=args.instances, tp=args.tp)
        )
        pool = Path(tmp) / "rings.pool"
        py = [sys.executable, "-m", "belugactl"]
        subprocess.run([*py, "pool", "create-file", "-f", str(manifest), str(pool)], check=True, capture_output=True)
        server = subprocess.Popen(  # noqa: S603 - our own interpreter
            [*py, "metadata-server", "-f", str(manifest), "--pool", str(pool), "--rpc-port", "0",
             "--admin-port", "0", "--fence-grace", "0", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            json.loads(server.stdout.readline())  # the start-up record: the server is serving
            time.sleep(args.settle)
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            time.sleep(args.seconds)
            c1, t1 = cpu_seconds(server.pid), time.monotonic()
        finally:
            server.terminate()
            server.wait(timeout=30)
        from belugactl.model.layout import resolve_layout
        from belugactl.model.manifest import load_manifest

        rings = resolve_layout(load_manifest(manifest)).rpc.ring_count  # as this belugactl lays them out
    out = {
        "hosts": args.hosts,
        "instances_per_host": args.instances,
        "tp": args.tp,
        "processes": args.hosts * args.instances * (1 + args.tp),
        "native_helper": record_native(),
        "rings": rings,
        "slots_per_ring": args.slots,
        "idle_cpu_percent": round(100 * (c1 - c0) / (t1 - t0), 2),
        "window_s": round(t1 - t0, 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
