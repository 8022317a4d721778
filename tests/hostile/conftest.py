"""Hostile clients against a real `metadata-server` process on 127.0.0.1.

Every attack is bounded in count and time. After each one the tests check the three things a KV
cache must keep: the server still serves a well-behaved client, its memory stays bounded (RSS via
psutil), and readers get exactly the bytes their writer committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.dataplane import native
from tests.support import mds_process
from tests.support.mds_process import Mds
from tests.support.small_rack import SMALL_RACK

NS = "m/tp0"
# Small limits so each attack reaches them quickly.
LIMITS = ("--tcp-max-connections", "32", "--tcp-idle-timeout", "2", "--tcp-max-buffered", "64KiB",
          "--tcp-accept-backoff-ms", "100")  # fmt: skip


@pytest.fixture
def manifest_path(tmp_path: Path) -> Path:
    path = tmp_path / "rack.yaml"
    path.write_text(SMALL_RACK)
    return path


@pytest.fixture
def pool_path(tmp_path: Path, manifest_path: Path) -> Path:
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool

    return create_file_pool(tmp_path / "pool.bin", load_manifest(manifest_path))


@contextmanager
def start_mds(manifest_path: Path, pool_path: Path, *extra: str, nofile: int | None = None) -> Iterator[Mds]:
    """The server with the small limits above (extra flags come after them, so they win)."""
    with mds_process.start_mds(manifest_path, pool_path, *LIMITS, *extra, nofile=nofile) as m:
        yield m


@pytest.fixture
def mds(manifest_path: Path, pool_path: Path) -> Iterator[Mds]:
    with start_mds(manifest_path, pool_path) as m:
        yield m
        assert m.proc.poll() is None, "the server died under attack"


def content(key: bytes, n: int, tag: bytes = b"") -> bytes:
    """A block's bytes, derived from its key (and a writer tag): any other bytes are wrong bytes."""
    seed = (tag + key) * (n // max(1, len(tag + key)) + 1)
    return seed[:n]


def write_block(pool, extents, data: bytes) -> None:
    pos = 0
    for off, n in extents:
        pool.write(off, data[pos : pos + n])
        pos += n


def read_block(pool, extents) -> bytes:
    return b"".join(pool.read(off, n) for off, n in extents)


def well_behaved_round_trip(address: str, pool, key: bytes, n: int = 8192) -> None:
    """A good client puts a block and reads it back byte for byte."""
    from belugactl.dataplane.client import connect

    c = connect(address, pool=pool, timeout_s=5)  # over TCP too: the server is held to the pool
    try:
        r = c.reserve(NS, key, n)
        assert c.writable(r)
        data = content(key, n)
        write_block(pool, r.extents, data)
        c.commit(r.token, native.crc32c(data))
        loc = c.get(NS, key)
        assert loc is not None and read_block(pool, loc.extents) == content(key, n)
        assert c.release([loc.lease_id]) == 1
    finally:
        c.close()


def until(pred: Callable[[], bool], timeout_s: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()
