"""Failover by SIGKILL, measured until `belugactl bench failover` exists (issue 32): a real etcd on
loopback (tests/support/etcd.py), two `metadata-server --standby` processes on one CPU-demo file
pool, `--blocks` committed blocks; each round kills the leader, times the first lookup answered by
the new one (a client on a ring retrying every 10 ms: the time a CXL-RPC client waits), checks every
committed block is still served with its bytes, and starts the killed one again as the standby.

    PYTHONPATH=. .venv/bin/python scripts/measure_failover.py --kills 5 --ttl 5 --blocks 1000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataError
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc
from tests.support.etcd import running_etcd

CPU_DEMO = Path(__file__).resolve().parents[1] / "examples" / "cpu-demo.yaml"
NS = "m/tp0"


def start(name: str, pool: Path, url: str, ttl: int, log: Path) -> tuple[subprocess.Popen, object]:
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(CPU_DEMO), "--pool", str(pool),
            "--rpc-port", "0", "--admin-port", "0", "--json", "--standby", "--etcd", url, "--member", name,
            "--leader-ttl", str(ttl)]  # fmt: skip
    err = open(log, "a")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)  # noqa: S603
    return proc, err


def record(proc: subprocess.Popen, tmp: str) -> dict:
    """The server's next start record; exits (never hangs) when it printed none."""
    line = proc.stdout.readline()
    if not line:
        sys.exit(f"a server exited without a record: see {tmp}/mds-*.err")
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=1000)
    args = ap.parse_args()
    with running_etcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        procs: dict = {}
        try:
            pool_path = Path(tmp) / "pool"
            create_file_pool(pool_path, CPU_DEMO)
            for name in ("mds-a", "mds-b"):
                procs[name] = start(name, pool_path, etcd.url, args.ttl, Path(tmp) / f"{name}.err")
                assert record(procs[name][0], tmp)["event"] == "standby"
            first = record(procs["mds-a"][0], tmp)
            assert first["event"] == "started", first
            leader = "mds-a"
            pool = PoolMapping.open(pool_path)
            client = connect(f"cxl://{pool_path}#1", pool=pool, timeout_s=5)
            keys = [os.urandom(32) for _ in range(args.blocks)]
            for k in keys:
                r = client.reserve(NS, k, 4096)
                pool.write(r.extents[0][0], k * 128)
                client.commit(r.token, zeros_crc(r.nbytes))
            prober = connect(f"cxl://{pool_path}#2", pool=pool, timeout_s=0.2)  # a client that waits 0.2 s a try
            times, lost, wrong = [], 0, 0
            for _ in range(args.kills):
                other = "mds-b" if leader == "mds-a" else "mds-a"
                killed = time.monotonic()
                os.kill(procs[leader][0].pid, signal.SIGKILL)
                procs[leader][0].wait()
                while True:
                    if time.monotonic() - killed > 60:
                        sys.exit(f"no server answered within 60 s of the kill: see {tmp}/mds-*.err")
                    try:
                        prober.reconnect()
                        if prober.lookup_prefix(NS, keys[:1]) == 1:
                            break
                    except MetadataError:
                        time.sleep(0.01)
                times.append(time.monotonic() - killed)
                rec = record(procs[other][0], tmp)
                assert rec["event"] == "started", rec
                client.reconnect()
                n = client.lookup_prefix(NS, keys)
                lost += len(keys) - n
                for k in keys[:n]:
                    loc = client.get(NS, k)
                    if loc is None or pool.read(loc.extents[0][0], 32 * 128) != k * 128:
                        wrong += 1
                procs[leader][1].close()
                procs[leader] = start(leader, pool_path, etcd.url, args.ttl, Path(tmp) / f"{leader}.err")
                assert record(procs[leader][0], tmp)["event"] == "standby"
                leader = other
            client.close()
            prober.close()
            pool.close()
        finally:
            for proc, err in procs.values():  # never left running, whatever happened
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=15)
                err.close()
    print(json.dumps({
        "kills": args.kills, "ttl_s": args.ttl, "blocks": args.blocks,
        "first_answer_s": {"p50": round(statistics.median(times), 3), "max": round(max(times), 3),
                           "all": [round(t, 3) for t in times]},
        "committed_blocks_lost": lost, "wrong_bytes_served": wrong,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
