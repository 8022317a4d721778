"""A real `belugactl metadata-server` process on 127.0.0.1 for tests, started on ports the kernel picks
(`--rpc-port 0 --admin-port 0`, read back from its `--json` start record: no probe-then-bind race).

The hostile tests and the connector's tests against a real server all start it here."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from tests.support.blocks import zeros_crc

REPO = Path(__file__).resolve().parents[2]
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"


class Mds:
    """A running metadata-server process and what it printed at start."""

    def __init__(self, proc: subprocess.Popen, record: dict, pool_path: Path, err=None) -> None:  # noqa: ANN001
        self.proc = proc
        self._err = err  # its stderr, a file: a pipe nobody reads would stall a chatty server
        self.record = record
        self.pool_path = pool_path
        self.ps = psutil.Process(proc.pid)

    @property
    def tcp(self) -> str:
        return self.record["rpc"]

    @property
    def port(self) -> int:
        return int(self.tcp.rsplit(":", 1)[1])

    def cxl(self, ring: int) -> str:
        return f"cxl://{self.pool_path}#{ring}"

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def admin(self, path: str) -> bytes:
        with urllib.request.urlopen(self.record["admin"] + path, timeout=5) as r:  # noqa: S310 - loopback
            return r.read()

    def stats(self) -> dict:
        return json.loads(self.admin("/stats"))

    def stats_since(self, t: float, timeout_s: float = 10.0) -> dict:
        """The first /stats snapshot the server took at or after `t` (time.time()): the loop refreshes it
        once per housekeeping tick, so one read straight after a burst of requests can predate them."""
        deadline = time.monotonic() + timeout_s
        while True:
            snap = self.stats()
            if snap.get("time", 0) >= t:
                return snap
            if time.monotonic() > deadline:
                raise AssertionError(f"no /stats snapshot after {t} within {timeout_s} s (last: {snap.get('time')})")
            time.sleep(0.05)

    def stderr(self) -> str:
        """What it wrote on stderr, once it has exited."""
        self.proc.wait(timeout=15)
        return _read(self._err)


def _read(err) -> str:  # noqa: ANN001
    err.seek(0)
    return err.read()


@contextmanager
def start_mds(manifest_path: Path, pool_path: Path, *extra: str, nofile: int | None = None) -> Iterator[Mds]:
    """Start the server, wait for its start record (printed once it serves), stop it on exit."""
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest_path), "--pool", str(pool_path),
            "--rpc-port", "0", "--admin-port", "0", "--json", *extra]  # fmt: skip

    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=limit_files)  # noqa: S603, PLW1509
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            proc.wait(timeout=15)
            raise AssertionError(f"the metadata server did not start: {_read(err)[-3000:]}")
        yield Mds(proc, json.loads(line), pool_path, err)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
        err.close()


@contextmanager
def cpu_demo_mds(tmp_path: Path, *extra: str) -> Iterator[Mds]:
    """The CPU demo's file pool (created in tmp_path) and a server on it, with no fencing grace."""
    from belugactl.pool.file_pool import create_file_pool

    pool = tmp_path / "pool"
    create_file_pool(pool, CPU_DEMO)
    with start_mds(CPU_DEMO, pool, "--fence-grace", "0", *extra) as m:
        yield m


def committed_keys(m: Mds, namespace: str, count: int = 125, nbytes: int = 96 * 1024) -> tuple[Any, list[bytes]]:
    """`count` random 32-byte keys committed to `namespace` through ring 1 (a 4000-token prompt's
    blocks of the CPU demo by default): (the writer client, the keys). Ring 2 is left for a reader."""
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping

    writer = connect(m.cxl(1), pool=PoolMapping.open(m.pool_path), timeout_s=5)
    keys = [os.urandom(32) for _ in range(count)]
    for k in keys:
        writer.commit(writer.reserve(namespace, k, nbytes).token, zeros_crc(nbytes))
    return writer, keys
