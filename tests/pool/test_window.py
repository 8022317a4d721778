"""Setup's and doctor's way in: a raw window at the start of the pool, under a Host's root, header or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem, PoolMismatch, StepFailed
from belugactl.host.host import Host
from belugactl.pool import header as hdr
from belugactl.pool.lock import ServerLock
from belugactl.pool.mapping import PoolMapping

MiB = 1 << 20


def blank_device(tmp_path: Path, size: int = 4 * MiB) -> tuple[Host, str]:
    (tmp_path / "dev").mkdir(exist_ok=True)
    with open(tmp_path / "dev" / "dax0.0", "wb") as fh:
        fh.truncate(size)
    return Host(tmp_path), "/dev/dax0.0"


@pytest.mark.parametrize("flush", [False, True])
def test_claim_word_compare_and_swap(tmp_path: Path, flush: bool) -> None:
    host, dev = blank_device(tmp_path)
    with PoolMapping.window(host, dev, 2 * MiB, flush=flush) as window:
        assert window.cas_u64(hdr.CLAIM_OFFSET, 0, 0xAB) == 0  # won
        assert window.cas_u64(hdr.CLAIM_OFFSET, 0, 0xCD) == 0xAB  # lost: the value found comes back
        assert window.load_u64(hdr.CLAIM_OFFSET) == 0xAB
        with pytest.raises(ValueError, match="8-byte aligned"):
            window.cas_u64(hdr.CLAIM_OFFSET + 4, 0, 1)
        window.write(hdr.MAGIC_OFFSET, hdr.MAGIC)
    # msync'ed into the file: another process reading the file sees both
    data = host.read_bytes(dev, 4096)
    assert hdr.read_claim(data) == 0xAB and data[: len(hdr.MAGIC)] == hdr.MAGIC


def test_a_window_has_no_verified_header(tmp_path: Path) -> None:
    host, dev = blank_device(tmp_path)
    with PoolMapping.window(host, dev, 2 * MiB, writable=False) as window:
        assert window.read(0, 8) == bytes(8) and window.size == 2 * MiB
        assert not window.needs_flush and window.layout is None
        with pytest.raises(PoolMismatch, match="raw window"):
            _ = window.geometry
        with pytest.raises(ValueError):
            window.read(2 * MiB - 4, 8)


def test_window_errors_name_the_device(tmp_path: Path) -> None:
    host, dev = blank_device(tmp_path)
    with pytest.raises(StepFailed, match="does not exist"):
        PoolMapping.window(host, "/dev/dax9.9", 2 * MiB)
    with pytest.raises(StepFailed, match=r"cannot map the first \d+ bytes of /dev/dax0.0"):
        PoolMapping.window(host, dev, 64 * MiB)  # larger than the device


def test_one_server_lock_per_pool(pool_path: Path) -> None:
    with PoolMapping.open(pool_path) as pool:
        first = pool.server_lock()
        try:
            with pytest.raises(EnvironmentProblem, match="another metadata server"):
                pool.server_lock()
        finally:
            first.release()
        assert not first.held
        again = ServerLock.acquire(pool_path)  # released means free again
        again.release()
