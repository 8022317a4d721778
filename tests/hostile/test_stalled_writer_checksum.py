"""A writer stalls between its fence check and its stores, past its deadline: the fence cannot stop it.

Its reservation is reclaimed and the same extents go to a new writer, who commits the block with
its CRC32C. Then the stalled writer wakes up and stores its stale bytes over the committed block.
No contract can prevent that store; the reader must catch it: `copy_verified` raises CorruptBlock
(it never hands back the stale bytes), the key can be deleted, and the server keeps serving.
"""

from __future__ import annotations

import time

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import connect, copy_verified
from belugactl.dataplane.metadata_errors import CorruptBlock, MetadataError, ReservationExpired
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, start_mds, until, well_behaved_round_trip, write_block

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
TTL = 1.0  # seconds: the writer window, short so the stall outlasts it quickly


def test_stalled_writer_overwriting_a_recommitted_block_is_caught_by_the_reader(manifest_path, pool_path) -> None:
    pool = PoolMapping.open(pool_path)
    key = b"stalled".ljust(32, b".")
    n = 192 << 10
    stale = content(key, n, b"STALE-WRITER")
    fresh = content(key, n, b"fresh-writer")
    with start_mds(manifest_path, pool_path, "--reservation-ttl", str(TTL)) as mds:
        stalled = connect(mds.tcp, timeout_s=5)
        r_old = stalled.reserve(NS, key, n)
        assert stalled.writable(r_old)  # the check it passes ... then it stalls past its deadline
        assert until(lambda: not stalled.writable(r_old), 10 * TTL)

        writer = connect(mds.cxl(1), pool=pool, timeout_s=5)
        r_new = None
        deadline = time.monotonic() + 10 * TTL
        while r_new is None and time.monotonic() < deadline:  # EXISTS until the old one is reclaimed
            try:
                r_new = writer.reserve(NS, key, n)
            except MetadataError:
                time.sleep(0.1)
        assert r_new is not None, "the stalled reservation was never reclaimed"
        assert {o for o, _ in r_new.extents} & {o for o, _ in r_old.extents}, "the test needs the same extents"
        write_block(pool, r_new.extents, fresh)
        writer.commit(r_new.token, checksum=native.crc32c(fresh))

        # The stalled writer wakes up and stores, with no further check (it passed one already).
        write_block(pool, r_old.extents, stale)
        with pytest.raises(ReservationExpired):
            stalled.commit(r_old.token, checksum=native.crc32c(stale))

        reader = connect(mds.cxl(2), pool=pool, timeout_s=5)
        loc = reader.get(NS, key)
        assert loc is not None and loc.checksum == native.crc32c(fresh)
        out = bytearray(n)
        with pytest.raises(CorruptBlock):
            copy_verified(pool.buf, loc, out, key=key)
        reader.release([loc.lease_id])
        # What a connector does next: drop the key, so later readers miss instead of re-reading it.
        assert reader.delete(NS, key)
        assert reader.get(NS, key) is None
        # get_many carries the checksum too, and an intact block passes.
        intact = b"intact".ljust(32, b".")
        r = writer.reserve(NS, intact, n)
        write_block(pool, r.extents, fresh)
        writer.commit(r.token, checksum=native.crc32c(fresh))
        (loc2,) = reader.get_many(NS, [intact])
        assert loc2 is not None and loc2.checksum == native.crc32c(fresh)
        assert copy_verified(pool.buf, loc2, out, key=intact) == n and bytes(out) == fresh
        reader.release([loc2.lease_id])

        well_behaved_round_trip(mds.tcp, pool, b"after".ljust(32, b"."))
        assert mds.proc.poll() is None
        for c in (stalled, writer, reader):
            c.close()
    pool.close()
