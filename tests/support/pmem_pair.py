"""A two-guest pmem lab with `belugactl setup` done on both hosts (lab-1 first), shared by the lab
tests that need no guests of their own: tests/dataplane/test_rpc_lab.py runs its metadata server on
it, then tests/setup/test_setup_lab.py checks the setups, reruns them and ends with a teardown.
tests/conftest.py's `pmem_pair` fixture starts it once and runs its users one after the other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from belugactl.lab import kernel, prereqs
from belugactl.lab.paths import STATE_ENV, cache_root
from belugactl.workflows.bench.etcd_local import free_port
from tests.support.lab import our_qemus, run_cli, unavailable

NAME = "pmem-pair"
MANIFEST = "examples/lab.yaml"
HOSTS = ("lab-1", "lab-2")


@dataclass
class PmemPair:
    env: dict[str, str]
    lab_dir: Path
    pool_file: Path
    # Each host's first `belugactl setup -f examples/lab.yaml --host H --json`, and its wall seconds.
    first_setup: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    # The guests reach 127.0.0.1:etcd_port here at 10.0.2.100:etcd_port (lab up --host-port): where a
    # test's etcd listens for an election between the guests (tests/dataplane/test_failover_lab.py).
    etcd_port: int = 0

    def sh(self, host: str, *argv: str, timeout: float = 500) -> subprocess.CompletedProcess[str]:
        return run_cli(self.env, "lab", "exec", "--name", NAME, "--timeout", str(timeout), host, "--", *argv,
                       timeout=timeout + 60)  # fmt: skip

    def share(self, host: str) -> Path:
        """A directory this process and the guest both see (the guest sees it at /run/belugactl-lab/share)."""
        return self.lab_dir / "guests" / host / "spool" / "share"

    def setup(self, host: str, *extra: str, manifest: str = MANIFEST) -> subprocess.CompletedProcess[str]:
        return self.sh(host, "belugactl", "setup", "-f", manifest, "--host", host, "--json", *extra)


def start_pmem_pair(state: Path) -> Iterator[PmemPair]:
    missing = prereqs.check()
    if missing:
        unavailable("; ".join(f"{m.reason} (Debian package {m.requirement.package})" for m in missing))
    env = dict(os.environ, **{STATE_ENV: str(state)})
    if kernel.find(cache_root()) is None:
        prep = run_cli(env, "lab", "prepare", "--profile", "pmem", timeout=900)
        if prep.returncode != 0:
            unavailable(f"`belugactl lab prepare` failed: {prep.stderr.strip()[-500:]}")
    try:
        t0 = time.monotonic()
        etcd_port = free_port()
        up = run_cli(env, "lab", "up", "--profile", "pmem", "--name", NAME, "--hosts", "2", "--host-port",
                     str(etcd_port), "--json", timeout=600)  # fmt: skip
        assert up.returncode == 0, f"lab up failed:\n{up.stderr[-3000:]}"
        lab = json.loads(up.stdout)["lab"]
        pair = PmemPair(env, Path(lab["dir"]), Path(lab["pool"]), etcd_port=etcd_port)
        pair.seconds["lab up"] = time.monotonic() - t0
        for host in HOSTS:  # lab-1 first: region, namespace and the pool header; lab-2 verifies it
            t0 = time.monotonic()
            pair.first_setup[host] = done = pair.setup(host)
            pair.seconds[f"setup {host}"] = time.monotonic() - t0
            assert done.returncode == 0, f"setup on {host} failed:\n{done.stderr[-3000:]}"
        yield pair
    finally:
        run_cli(env, "lab", "down", "--name", NAME, timeout=120)
        for pid in our_qemus(state):  # last resort, still only our own QEMU processes
            os.kill(pid, signal.SIGKILL)


def run_users_together(items: list, fixture: str) -> None:
    """Move the tests using `fixture` next to the first of them (their own order kept), so the
    shared lab is not left idle while other tests boot guests of their own."""
    users = [item for item in items if fixture in getattr(item, "fixturenames", ())]
    if not users:
        return
    first = items.index(users[0])
    others = [item for item in items if fixture not in getattr(item, "fixturenames", ())]
    items[:] = others[:first] + users + others[first:]
