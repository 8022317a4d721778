"""What an idle metadata server costs and how fast it wakes: the CPU it takes while nobody asks
(a share of one core, over 5 s), and how long a PING on a CXL-RPC ring takes after 50 ms of quiet
(the server is then in its idle poll, as it is when a pool hit's lookup arrives). A real server
process on the CPU demo's file pool, `--spin-after-ms 0` (no busy-poll: the CPU demo's setting).

Run from the repository root, at two commits to compare them:
PYTHONPATH=. python scripts/measure-server-idle.py [--rounds 200] [--pause 0.05]"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from belugactl.dataplane.client import connect
from belugactl.dataplane.rpc.protocol import Op
from belugactl.pool.mapping import PoolMapping
from tests.support.mds_process import cpu_demo_mds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--pause", type=float, default=0.05)
    args = ap.parse_args()
    with cpu_demo_mds(Path(tempfile.mkdtemp()), "--spin-after-ms", "0") as m:
        time.sleep(1.0)
        cpu0 = m.cpu_s()
        time.sleep(5.0)
        idle = (m.cpu_s() - cpu0) / 5.0
        pool = PoolMapping.open(m.pool_path)
        c = connect(m.cxl(2), pool=pool, timeout_s=5)
        t = c.transport
        xs = []
        for _ in range(args.rounds):
            time.sleep(args.pause)
            t0 = time.perf_counter_ns()
            t.call(Op.PING, c._epoch32, b"x", c._timeout_ns)
            xs.append((time.perf_counter_ns() - t0) / 1e3)
        xs.sort()

        def q(f: float) -> float:
            return xs[int(len(xs) * f)]

        print(f"idle server: {idle * 100:.1f} % of a core")
        print(
            f"PING after {args.pause * 1e3:.0f} ms of quiet ({args.rounds} rounds): p10 {q(0.1):.0f} us, "
            f"p25 {q(0.25):.0f}, median {statistics.median(xs):.0f}, p75 {q(0.75):.0f}, p90 {q(0.9):.0f}"
        )


if __name__ == "__main__":
    main()
