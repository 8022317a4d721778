"""A real etcd (Debian's `etcd-server`, 3.4) on loopback for tests: a temporary data dir, ports the
kernel picked a moment before (etcd cannot be told to bind port 0 and report it), stopped on exit.

Skipped with the reason where the binary is absent; failed under CI=true (`scripts/bootstrap`
installs `etcd-server`). It never touches a system etcd: its own data dir, its own ports, loopback
only. `stop()` / `start()` again on the same data dir and ports: "etcd lost, then back"."""

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

import pytest

ETCD_PACKAGE = "etcd-server"


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd",) if os.access(p, os.X_OK)), None)


def require_etcd() -> str:
    path = etcd_binary()
    if path is None:
        reason = f"no etcd binary (apt-get install -y {ETCD_PACKAGE}; scripts/bootstrap installs it)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"etcd missing in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / "etcd.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

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
                raise AssertionError(f"etcd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:  # noqa: S310 - loopback
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"etcd not healthy after {timeout_s} s: {self.log.read_text()[-2000:]}")

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
def running_etcd() -> Iterator[Etcd]:
    binary = require_etcd()
    with tempfile.TemporaryDirectory(prefix="beluga-etcd-") as tmp:
        etcd = Etcd(binary, Path(tmp) / "data")
        etcd.start()
        try:
            yield etcd
        finally:
            etcd.stop()
