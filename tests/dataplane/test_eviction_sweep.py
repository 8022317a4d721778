"""The watermark sweep runs in the server's loop, between requests: a real server process, filled past
its high watermark and then left alone, evicts down to its low watermark with no request asking it to
(the commit that crossed the watermark only started the sweep: mds/index.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from belugactl.dataplane.client import Reservation, connect
from tests.support.blocks import zeros_crc
from tests.support.mds_process import start_mds
from tests.support.small_rack import SMALL_RACK

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]
BLOCK = 4096


def test_the_server_sweeps_down_to_the_low_watermark_between_requests(tmp_path: Path) -> None:
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool

    manifest = tmp_path / "rack.yaml"
    manifest.write_text(SMALL_RACK)
    pool = create_file_pool(tmp_path / "pool.bin", load_manifest(manifest))
    with start_mds(manifest, pool, "--fence-grace", "0", "--high-watermark", "0.5", "--low-watermark", "0.1") as m:
        c = connect(m.tcp, timeout_s=10)
        cap = c.stats()["bytes_capacity"]
        n = 0
        while n * BLOCK <= 0.55 * cap:  # past the high watermark in 4 KiB blocks, a batch at a time
            keys = [b"s%08d" % i + b"." * 23 for i in range(n, n + 500)]
            got = c.reserve_many("m/sweep", [(k, BLOCK) for k in keys])
            tokens = [r.token for r in got if isinstance(r, Reservation)]
            assert len(tokens) == len(keys)
            assert all(code == 0 for code in c.commit_many([(t, zeros_crc(BLOCK)) for t in tokens]))
            n += len(keys)
        c.close()
        filled = time.time()
        # Nothing asks any more: the loop's own steps take usage under the low watermark (read from
        # snapshots taken after the fill: an older one still shows the pool nearly empty).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            idx = m.stats_since(filled)["index"]
            if idx["bytes_used"] <= 0.1 * cap and not idx["sweeping"]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the sweep did not finish: {idx['bytes_used']} of {cap} bytes used")
        evicted = (0.5 * cap - 0.1 * cap) // BLOCK
        assert idx["evictions"] >= evicted > 256  # more than one step's worth
        assert idx["entries"] == n - idx["evictions"]
        assert m.proc.poll() is None
