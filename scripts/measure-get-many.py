"""How long the scheduler's lookup of a 4000-token pool hit (one GET_MANY burst for 125 keys) and the
worker's lease release take on a CXL-RPC ring of the CPU demo's file pool, as the connector makes them
(`locate_many` through the plugin's BestEffortIndex), against a real metadata server process:

- warm (back to back), and after an idle pause (the server then sleeps between looks), with the
  release waited for, and posted (what a load that ended within the lease window does);
- beside a busy Python thread in the same process (the client must take the GIL back);
- beside 1 or 2 processes that spin on sched_yield (what vLLM's shared-memory queue readers do while
  a request runs), on this machine's cores.

`--spin-after-ms` is the server's busy-poll setting (the CPU demo uses 0). Run from the repository
root: PYTHONPATH=. python scripts/measure-get-many.py [--spin-after-ms 0]"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "vllm_beluga"))

from vllm_beluga.index_client import BestEffortIndex  # noqa: E402
from vllm_beluga.stats import ConnectorStats  # noqa: E402
from vllm_beluga.transfer import locate_many  # noqa: E402

from tests.support.mds_process import committed_keys, cpu_demo_mds  # noqa: E402

NS = "measure"
YIELD_SPIN = "import os\nwhile True: os.sched_yield()"


def row(label: str, lookup: list[float], release: list[float]) -> str:
    def f(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"median {statistics.median(xs) * 1e3:.3f} ms, p90 {xs[int(len(xs) * 0.9)] * 1e3:.3f} ms"

    return f"{label:34} lookup {f(lookup)} | release {f(release)}"


def measure(
    index: BestEffortIndex, keys: list[bytes], rounds: int, pause: float, posted: bool = False
) -> tuple[list[float], list[float]]:
    lookups, releases = [], []
    for _ in range(rounds):
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        located = locate_many(index, NS, keys)
        t1 = time.perf_counter()
        leases = [loc[1] for loc in located if loc]
        if not (posted and index.post_release(leases)):  # posted: what a load within the lease window does
            index.release(leases)
        lookups.append(t1 - t0)
        releases.append(time.perf_counter() - t1)
        assert all(loc is not None for loc in located)
    return lookups, releases


def beside(what: Callable[[], object], hogs: int) -> object:
    procs = [subprocess.Popen([sys.executable, "-c", YIELD_SPIN]) for _ in range(hogs)]  # noqa: S603
    try:
        time.sleep(0.3)
        return what()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-after-ms", default="0")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with cpu_demo_mds(Path(tempfile.mkdtemp()), "--spin-after-ms", args.spin_after_ms) as m:
        writer, keys = committed_keys(m, NS)
        index = BestEffortIndex(m.cxl(2), stats=ConnectorStats(None, role="scheduler"))
        print(f"server --spin-after-ms {args.spin_after_ms}; {os.cpu_count()} cores; slot payload "
              f"{writer.transport.max_payload} B")  # fmt: skip
        measure(index, keys, 5, 0)  # connect, open the namespace, warm up
        print(row("warm", *measure(index, keys, args.rounds, 0)))
        print(row("after 0.2 s idle", *measure(index, keys, args.rounds, 0.2)))
        print(row("after 0.2 s idle, release posted", *measure(index, keys, args.rounds, 0.2, posted=True)))
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                pass

        thread = threading.Thread(target=busy)
        thread.start()
        print(row("beside a busy Python thread", *measure(index, keys, args.rounds, 0.05)))
        stop.set()
        thread.join()
        for hogs in (1, 2):
            result = beside(lambda: measure(index, keys, args.rounds, 0.05), hogs)
            print(row(f"beside {hogs} sched_yield spinner(s)", *result))  # type: ignore[misc]
        client = index._client
        trips, sent = client.round_trips, client.messages
        index.release([loc[1] for loc in locate_many(index, NS, keys) if loc])
        print(f"per lookup of {len(keys)} keys and its release: {client.messages - sent} messages, "
              f"{client.round_trips - trips} round trips")  # fmt: skip


if __name__ == "__main__":
    main()
