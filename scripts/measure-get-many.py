"""How long one GET_MANY burst of a 4000-token prompt's 125 keys takes on a CXL-RPC ring of a file pool
(the scheduler's lookup of a pool hit), next to LOOKUP_PREFIX and the lease release, warm and after
an idle pause, and beside a busy Python thread in the same process (the client takes the GIL back
after each reply it waits for). Run from the repository root: PYTHONPATH=. python scripts/measure-get-many.py"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from belugactl.dataplane.client import connect
from belugactl.pool.mapping import PoolMapping
from tests.support.mds_process import cpu_demo_mds

NS = "measure"


def timed(fn, rounds: int = 20, pause: float = 0.0) -> str:  # noqa: ANN001
    ts = []
    for _ in range(rounds):
        if pause:
            time.sleep(pause)
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return f"median {statistics.median(ts) * 1e3:.3f} ms, min {min(ts) * 1e3:.3f} ms"


def main() -> None:
    with cpu_demo_mds(Path(tempfile.mkdtemp()), "--spin-after-ms", "50") as m:
        pool = PoolMapping.open(m.pool_path)
        c = connect(m.cxl(1), pool=pool, timeout_s=5)
        keys = [os.urandom(32) for _ in range(125)]
        for k in keys:
            c.commit(c.reserve(NS, k, 96 * 1024).token)

        def get_many() -> None:
            c.release([loc.lease_id for loc in c.get_many(NS, keys)])

        def lookup() -> None:
            c.release(c.lookup_prefix_leased(NS, keys)[1])

        for label, pause in (("warm", 0.0), ("after 0.2 s idle", 0.2)):
            print(f"{label:18} GET_MANY + release       {timed(get_many, pause=pause)}")
            print(f"{label:18} LOOKUP_PREFIX + release  {timed(lookup, pause=pause)}")
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                pass

        thread = threading.Thread(target=busy)
        thread.start()
        print(f"{'beside a busy thread':18} GET_MANY + release       {timed(get_many)}")
        stop.set()
        thread.join()
        sent = c.messages
        c.release([loc.lease_id for loc in c.get_many(NS, keys)])
        print(f"messages per GET_MANY of {len(keys)} keys and its release: {c.messages - sent}")


if __name__ == "__main__":
    main()
