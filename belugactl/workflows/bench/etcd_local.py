"""A throwaway etcd on loopback (Debian's `etcd-server`, 3.4): a temporary data dir, ports the kernel
picked a moment before (etcd cannot be told to bind port 0 and report it), stopped on exit.

For `bench failover` and the tests (tests/support/etcd.py). It never touches a system etcd: its own
data dir, its own ports, loopback only, a bounded start. `stop()` / `start()` again on the same data
dir and ports: "etcd lost, then back"."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from belugactl.errors import EnvironmentProblem

ETCD_PACKAGE = "etcd-server"


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd",) if os.access(p, os.X_OK)), None)


def missing_etcd() -> EnvironmentProblem:
    return EnvironmentProblem(
        "no etcd binary on this machine",
        why="the benchmark starts a throwaway etcd on loopback for the leader election (neither `etcd` on "
        "PATH nor /usr/bin/etcd)",
        fix=f"apt-get install -y {ETCD_PACKAGE} (scripts/bootstrap installs it), or pass --etcd URL of a running etcd",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, binary: str, data_dir: Path, client_port: int | None = None) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port = client_port or free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / "etcd.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def _failed(self, what: str) -> EnvironmentProblem:
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return EnvironmentProblem(what, why=tail or None, fix="see the etcd log above; is the port range exhausted?")

    def start(self, timeout_s: float = 20.0) -> None:
        argv = [
            self.binary, "--name", "t0", "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"t0=http://127.0.0.1:{self.peer_port}",
            "--heartbeat-interval", "50", "--election-timeout", "500",
        ]  # fmt: skip
        log = open(self.log, "a")  # noqa: SIM115 - the process holds it
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)  # noqa: S603
        log.close()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise self._failed(f"etcd exited {self.proc.returncode} at start")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:  # noqa: S310 - loopback
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise self._failed(f"etcd not healthy after {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def local_etcd(binary: str | None = None, client_port: int | None = None) -> Iterator[Etcd]:
    """A started etcd on loopback in a temporary directory, stopped and removed on exit; `client_port`:
    the one it must listen on (a lab's guests reach it through a forward set up at boot)."""
    binary = binary or etcd_binary()
    if binary is None:
        raise missing_etcd()
    with tempfile.TemporaryDirectory(prefix="beluga-etcd-") as tmp:
        etcd = Etcd(binary, Path(tmp) / "data", client_port)
        etcd.start()
        try:
            yield etcd
        finally:
            etcd.stop()
