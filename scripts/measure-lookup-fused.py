"""The vLLM scheduler's pool-hit lookup (125 keys, one GET_MANY burst, through the plugin's
`locate_many` as the connector calls it) after an idle pause, with the burst encoded, sent and
decoded in one native call (`rpc_get_many`) against the same lookup through `call_many` and the
Python around it, alternating round by round in one process so both see the same machine.

`--spin-after-ms 60000` keeps the server busy-polling, which leaves only the client's own time;
0 (the CPU demo's setting) adds the server's wake-up. `--copy-mib 12` copies that much before each
lookup (a 4000-token hit's copy of the previous request), so the lookup starts with cold caches.
Run from the repository root:
PYTHONPATH=. python scripts/measure-lookup-fused.py [--pause 0.2] [--rounds 40] [--spin-after-ms 0] [--copy-mib 0]"""

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--spin-after-ms", default="0")
    ap.add_argument("--copy-mib", type=int, default=0)
    args = ap.parse_args()
    src, dst = bytes(args.copy_mib << 20), bytearray(args.copy_mib << 20)
    fused = transport_cxl._rpc_get_many
    if fused is None:
        sys.exit("the native helper has no rpc_get_many: build it first (bash scripts/bootstrap)")
    with plugin_reader("scheduler", "--spin-after-ms", args.spin_after_ms, namespace=NS) as (index, keys):
        times: dict[str, list[float]] = {"one native call": [], "call_many + Python": []}
        for i in range(2 * args.rounds):
            label = "one native call" if i % 2 == 0 else "call_many + Python"
            transport_cxl._rpc_get_many = fused if i % 2 == 0 else None
            time.sleep(args.pause)
            dst[:] = src
            t0 = time.perf_counter_ns()
            located = locate_many(index, NS, keys)
            times[label].append((time.perf_counter_ns() - t0) / 1e3)
            assert all(loc is not None for loc in located)
            index.release([loc[1] for loc in located if loc])
        print(
            f"125-key lookup after {args.pause * 1e3:.0f} ms idle and a {args.copy_mib} MiB copy, "
            f"server --spin-after-ms {args.spin_after_ms}:"
        )
        print_quartiles(times, 20)


if __name__ == "__main__":
    main()
