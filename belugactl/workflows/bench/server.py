"""The metadata server process the data plane's benchmarks start, and the small rack they start it on.

Its own module so that every benchmark imports it from below (bench rpc, bench mds, the batched
puts, bench overlap) and none imports another benchmark for it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from belugactl.errors import EnvironmentProblem


def bench_rack(*, spare_rings: int = 2, slots_per_ring: int = 128) -> str:
    """A small rack whose ring has room for 128 requests in flight; `spare_rings` more rings than its
    two processes use (`bench mds --idle --idle-rings` lays out many, of 256 slots as a rack's).

    Its clients may hold 2^30 live leases: the lookup benchmarks never release theirs (they measure
    the grant), and at the default per-client cap (32,768) they would measure misses after a moment."""
    return f"""\
version: 1
name: bench-rpc
pool:
  source: {{kind: cxl-region, memdevs: all, type: ram}}
  size: 256MiB
  align: 2MiB
layout:
  metadata: {{slots_per_ring: {slots_per_ring}, slot_size: 256B, spare_rings: {spare_rings}, journal: 2MiB}}
  shared_kv: 128MiB
  partition_size: equal
hosts:
  - name: bench-0
    address: 127.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {{cpu_nodes: 1, cxl_nodes: 1}}
    gpus: {{count: 1, model: L40S}}
serve:
  metadata: {{client_live_leases: 1073741824}}
  vllm:
    model: bench/model
    instances_per_host: 1
"""


BENCH_RACK = bench_rack()


@contextlib.contextmanager
def running_server(
    manifest: Path, pool: Path, *, cpu: int | None = None, extra: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Start `belugactl metadata-server` in a child process; yield its start-up record; stop it."""
    argv = [
        sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
        "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json", *(extra or []),
    ]  # fmt: skip
    env = dict(os.environ)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # noqa: S603
    try:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(proc.pid, {cpu})
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise EnvironmentProblem("the metadata server did not start", why=err.strip()[-2000:])
        record = json.loads(line)
        record["pid"] = proc.pid
        yield record
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
