"""Helpers for the burst and flood attacks: a rack with a 1 GiB area, filling it, raw frames."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane.client import Reservation
from belugactl.dataplane.rpc.protocol import HEADER, MAGIC
from tests.hostile.conftest import start_mds
from tests.support.blocks import zeros_crc
from tests.support.mds_process import Mds
from tests.support.small_rack import SMALL_RACK

# The small rack with a 1 GiB area (a sparse file): room for an index of tens of thousands of
# blocks, and per-owner caps below the whole area (mds/quotas.py).
BIG_RACK = SMALL_RACK.replace("size: 64MiB", "size: 1088MiB").replace("shared_kv: 40MiB", "shared_kv: 1024MiB")
ENTRIES = 30000


@pytest.fixture(name="big")
def big_fixture(tmp_path: Path) -> Iterator[Mds]:
    """A server on the big rack's pool (import this into a test module to use `big`)."""
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool

    manifest = tmp_path / "rack.yaml"
    manifest.write_text(BIG_RACK)
    pool = create_file_pool(tmp_path / "pool.bin", load_manifest(manifest))
    with start_mds(manifest, pool) as m:
        yield m
        assert m.proc.poll() is None, "the server died under attack"


def fill(c, namespace: str, n: int, *, commit: bool) -> None:
    """n 4 KiB blocks of `namespace`, committed or left reserved, in batches."""
    for start in range(0, n, 5000):
        keys = [b"k%08d" % i + b"." * 23 for i in range(start, min(n, start + 5000))]
        got = c.reserve_many(namespace, [(k, 4096) for k in keys])
        tokens = [r.token for r in got if isinstance(r, Reservation)]
        assert len(tokens) == len(keys)
        if commit:
            assert all(code == 0 for code in c.commit_many([(t, zeros_crc(4096)) for t in tokens]))


def frames(op: int, epoch32: int, payload: bytes, size: int) -> bytes:
    one = HEADER.size + len(payload)
    out = bytearray()
    seq = 0
    while len(out) + 4 + one <= size:
        out += one.to_bytes(4, "little") + HEADER.pack(0, seq, MAGIC, epoch32, op, 0, len(payload)) + payload
        seq += 1
    return bytes(out)


def attack(port: int, blob: bytes, count: int) -> tuple[threading.Thread, list[int]]:
    """Write the whole blob at once and read the replies (a client that reads keeps its place)."""
    got = [0]
    s = socket.create_connection(("127.0.0.1", port), timeout=30)

    def run() -> None:
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        s.sendall(blob)
        reader.join(30)
        s.close()

    def drain() -> None:
        buf = bytearray()
        while got[0] < count:
            try:
                data = s.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "little"):
                del buf[: 4 + int.from_bytes(buf[:4], "little")]
                got[0] += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got
