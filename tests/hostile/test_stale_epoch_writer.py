"""A writer of epoch N keeps writing after a SIGKILL restart: it must never overwrite a block of epoch N+1.

The old writer obeys the client contract (it writes only while `writable(r)`), but it is a TCP
client, so it cannot see the pool header's epoch: only its own deadline stops it. The new server
quarantines RESERVE until that deadline has passed, so the new writer's extents (the same ones:
the allocator restarts empty) are handed out only after the old writer has stopped.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataError
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, read_block, start_mds, write_block
from tests.support.blocks import zeros_crc

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
TTL = "5"  # seconds: the writer window, so the quarantine is short


def test_stale_writer_after_sigkill_restart_never_overwrites_a_new_block(manifest_path, pool_path) -> None:
    pool = PoolMapping.open(pool_path)
    key = b"contested".ljust(32, b".")
    n = 256 << 10
    old_bytes = content(key, n, b"OLD-EPOCH")
    new_bytes = content(key, n, b"new-epoch")
    stop = threading.Event()
    old_writes = []
    with start_mds(manifest_path, pool_path, "--reservation-ttl", TTL) as first:
        old = connect(first.tcp, timeout_s=5)
        reserved_at = time.monotonic()
        r_old = old.reserve(NS, key, n)

        def stale_writer() -> None:
            # Writes as long as its own contract allows, never commits (its server dies).
            while not stop.is_set() and old.writable(r_old):
                write_block(pool, r_old.extents, old_bytes)
                old_writes.append(time.monotonic())
                time.sleep(0.005)

        thread = threading.Thread(target=stale_writer, daemon=True)
        thread.start()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    with start_mds(manifest_path, pool_path, "--reservation-ttl", TTL) as second:
        # Quarantined, unless starting took longer than the window (a loaded machine): then the
        # old writer's deadline has passed already and the checks below hold all the same.
        assert second.record["reserve_quarantine_s"] > 0 or time.monotonic() - reserved_at > float(TTL)
        new = connect(second.cxl(1), pool=pool, timeout_s=5)
        deadline = time.monotonic() + 15
        r_new = None
        while r_new is None and time.monotonic() < deadline:  # NOT_READY during the quarantine
            try:
                r_new = new.reserve(NS, key, n)
            except MetadataError:
                time.sleep(0.05)
        assert r_new is not None, "the quarantine never ended"
        granted = time.monotonic()
        overlap = {o for o, _ in r_new.extents} & {o for o, _ in r_old.extents}
        assert overlap, "the test needs the new writer to get the old writer's extents"
        write_block(pool, r_new.extents, new_bytes)
        new.commit(r_new.token, zeros_crc(r_new.nbytes))
        time.sleep(0.3)  # give a misbehaving old writer time to strike
        reader = connect(second.cxl(2), pool=pool, timeout_s=5)
        loc = reader.get(NS, key)
        assert loc is not None and read_block(pool, loc.extents) == new_bytes
        assert not old_writes or old_writes[-1] < granted  # the old writer had stopped before the grant
        stop.set()
        thread.join(5)
        for c in (old, new, reader):
            c.close()
    pool.close()
