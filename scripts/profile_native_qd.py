"""The server's capacity under the C load generator, alone, for profiling: one bench server (as `bench rpc`
starts it, pinned to CPU 1), one key committed, `rpc_burst` at QD for SECONDS, ops/s printed. With
PERF=FILE the server is recorded by `perf record -g` while the load runs; with CPROF=FILE the server runs
under cProfile (slower: compare like with like).

    PYTHONPATH=. .venv/bin/python scripts/profile_native_qd.py 3 128
    PERF=/tmp/server.data PYTHONPATH=. .venv/bin/python scripts/profile_native_qd.py 3 128
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from belugactl.dataplane import native
from belugactl.dataplane.client import connect
from belugactl.dataplane.rpc import protocol as p
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.bench import rpc_mds as bench
from belugactl.workflows.bench.server import running_server


def main() -> None:
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    qd = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    if os.environ.get("CPROF"):
        # running_server starts sys.executable: a wrapper that runs the server under cProfile.
        wrapper = Path(tempfile.mkdtemp()) / "python-cprofile"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m cProfile -o "$CPROF" "$@"\n')
        wrapper.chmod(0o755)
        sys.executable = str(wrapper)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "rack.yaml"
        manifest.write_text(bench.BENCH_RACK)
        pool_path = create_file_pool(Path(tmp) / "pool.bin", manifest)
        os.sched_setaffinity(0, {0})
        with running_server(manifest, pool_path, cpu=1) as srv:
            pool = PoolMapping.open(pool_path)
            client = connect(f"cxl://{pool_path}#0", pool=pool, timeout_s=5.0)
            ns = client._ns_id(bench.NAMESPACE)
            key = bytes(random.getrandbits(8) for _ in range(bench.KEY_LEN))
            r = client.reserve(bench.NAMESPACE, key, 4096)
            client.commit(r.token, native.crc32c(bytes(4096)))
            payload = p.encode_lookup(ns, [key])
            bench._native_throughput(client, payload, qd, 0.5)  # warm up
            perf = None
            if os.environ.get("PERF"):
                argv = ["perf", "record", "-q", "-F", "4000", "-g", "-o", os.environ["PERF"], "-p", str(srv["pid"])]
                perf = subprocess.Popen(argv)  # noqa: S603
                time.sleep(0.5)
            ops = bench._native_throughput(client, payload, qd, secs)
            if perf is not None:
                perf.send_signal(2)
                perf.wait()
            print(f"QD{qd}: {ops / 1e6:.2f} Mops")
            client.close()
            pool.close()


if __name__ == "__main__":
    main()
