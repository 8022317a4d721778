"""A real etcd (Debian's `etcd-server`, 3.4) on loopback for tests: the product's throwaway etcd
(belugactl/workflows/bench/etcd_local.py, which `bench failover` starts), skipped with the reason
where the binary is absent and failed under CI=true (`scripts/bootstrap` installs `etcd-server`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from belugactl.workflows.bench.etcd_local import ETCD_PACKAGE, Etcd, etcd_binary, local_etcd
from belugactl.workflows.bench.etcd_local import free_port as _free_port

__all__ = ["ETCD_PACKAGE", "Etcd", "_free_port", "etcd_binary", "require_etcd", "running_etcd"]


def require_etcd() -> str:
    path = etcd_binary()
    if path is None:
        reason = f"no etcd binary (apt-get install -y {ETCD_PACKAGE}; scripts/bootstrap installs it)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"etcd missing in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    return path


@contextmanager
def running_etcd(client_port: int | None = None) -> Iterator[Etcd]:
    with local_etcd(require_etcd(), client_port) as etcd:
        yield etcd
