"""A vLLM worker's posted lease release after a pool hit's copy (125 leases, `post_release` through
the plugin's `BestEffortIndex` as the connector calls it), encoded and posted in one native call
(`rpc_post_release`) against the Python encode and submits, alternating round by round in one
process so both see the same machine. Before each release a 12 MiB copy (a 4000-token hit of the
CPU demo model) pushes the interpreter out of the caches, as the copy in the engine does; the
replies are taken outside the timing.

Run from the repository root:
PYTHONPATH=. python scripts/measure-release-posted.py [--pause 0.1] [--rounds 40]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "vllm_beluga"))

from vllm_beluga.transfer import locate_many  # noqa: E402

from belugactl.dataplane.rpc import transport_cxl  # noqa: E402
from tests.support.mds_process import plugin_reader, print_quartiles  # noqa: E402

NS = "measure"
HIT_BYTES = 12 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pause", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    fused = transport_cxl._rpc_post_release
    if fused is None:
        sys.exit("the native helper has no rpc_post_release: build it first (bash scripts/bootstrap)")
    src, dst = bytes(HIT_BYTES), bytearray(HIT_BYTES)
    with plugin_reader("worker0", "--spin-after-ms", "0", namespace=NS) as (index, keys):
        times: dict[str, list[float]] = {"one native call": [], "Python encode + submit": []}
        for i in range(2 * args.rounds):
            label = "one native call" if i % 2 == 0 else "Python encode + submit"
            transport_cxl._rpc_post_release = fused if i % 2 == 0 else None
            leases = [loc[1] for loc in locate_many(index, NS, keys) if loc]
            assert len(leases) == len(keys)
            time.sleep(args.pause)
            dst[:] = src  # the hit's copy
            t0 = time.perf_counter_ns()
            assert index.post_release(leases)
            times[label].append((time.perf_counter_ns() - t0) / 1e3)
            index._client.collect_posted()
            assert index._client.posted_leases_ended == 0 and index._client.posted_refused == 0
        print(f"posted release of {len(keys)} leases after a 12 MiB copy, {args.pause * 1e3:.0f} ms idle before it:")
        print_quartiles(times, 24)


if __name__ == "__main__":
    main()
