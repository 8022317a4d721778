"""The pause prober of `bench mds --scale`: a process of its own that asks the metadata server one
lookup at a time, about once a millisecond, and reports every long gap between two answers.

A separate process, not a thread of the benchmark: a thread would share the filler's interpreter
lock, and a gap would then be the lock's, not the server's. Run by argv:

    python -m belugactl.workflows.bench.mds_pause_probe POOL RING NAMESPACE THRESHOLD_MS

It prints one line per gap longer than THRESHOLD_MS, `gap <end, CLOCK_MONOTONIC s> <gap s>`, and on
SIGTERM one closing line, `done <answers> <longest gap s>`. CLOCK_MONOTONIC is the machine's, so the
benchmark can place each gap in the phase it fell in.
"""

from __future__ import annotations

import signal
import sys
import time

PROBE_INTERVAL_S = 0.001
PROBE_TIMEOUT_S = 600.0  # a pause is measured, never turned into a client error


def probe(pool_path: str, ring: int, namespace: str, threshold_s: float) -> int:
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    pool = PoolMapping.open(pool_path)
    client = connect(f"cxl://{pool_path}#{ring}", pool=pool, timeout_s=PROBE_TIMEOUT_S)
    key = bytes(32)  # a miss: the lookup's cost, not a lease
    answers, longest = 0, 0.0
    print("ready", flush=True)
    last = time.monotonic()
    try:
        while not stop:
            client.lookup_prefix(namespace, [key])
            now = time.monotonic()
            gap = now - last
            last = now
            answers += 1
            if gap > longest:
                longest = gap
            if gap > threshold_s:
                print(f"gap {now:.6f} {gap:.6f}", flush=True)
            time.sleep(PROBE_INTERVAL_S)
    finally:
        print(f"done {answers} {longest:.6f}", flush=True)
        client.close()
        pool.close()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: mds_pause_probe POOL RING NAMESPACE THRESHOLD_MS", file=sys.stderr)
        return 2
    return probe(argv[0], int(argv[1]), argv[2], float(argv[3]) / 1000)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
