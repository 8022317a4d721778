"""A real metadata-server process on a file pool told of a poisoned line (POST /poison): the block on
it is dropped (a miss for readers, a "deleted" removal for the connector's KV events), the others
are kept, nothing new is placed on the quarantined chunk, and the server keeps serving."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.allocator import CHUNK
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc
from tests.support.mds_process import Mds, committed_keys, cpu_demo_mds

NS = "poison@test@tp0of1"


def _post(m: Mds, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(m.record["admin"] + "/poison", data=body, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_for(m: Mds, what: str, done) -> dict:  # noqa: ANN001
    """The server's /stats once `done(stats)` holds (the loop applies pushes at its next turn)."""
    for _ in range(400):
        stats = m.stats()
        if done(stats):
            return stats
        time.sleep(0.025)
    raise AssertionError(f"the server never {what}: {stats.get('poison')}")


@pytest.mark.process
def test_a_pushed_range_drops_the_block_on_it_and_the_server_keeps_serving(tmp_path: Path) -> None:
    with cpu_demo_mds(tmp_path) as m:
        writer, keys = committed_keys(m, NS, count=40)
        pool = PoolMapping.open(m.pool_path)
        reader = connect(m.cxl(2), pool=pool, timeout_s=5)
        victim = reader.get(NS, keys[10])
        assert victim is not None
        reader.release([victim.lease_id])
        kv = pool.geometry.shared_kv_offset
        line = victim.extents[0][0] + 4096  # a line inside the block's bytes
        chunk = kv + (line - kv) // CHUNK * CHUNK

        assert _post(m, b'{"ranges": [{"offset": "0x10", "length": 64}]}')[0] == 400  # hostile: nothing queued
        status, body = _post(m, json.dumps({"ranges": [{"offset": line, "length": 64}]}).encode())
        assert (status, body["queued"]) == (200, 1)
        stats = _wait_for(m, "dropped the block", lambda s: s["poison"]["blocks_dropped"] >= 1)
        poison = stats["poison"]
        assert poison["blocks_dropped"] == 1 and poison["chunks_quarantined"] == 1
        assert poison["bytes_quarantined"] == CHUNK and poison["pushes"] == 1

        assert reader.get(NS, keys[10]) is None  # a miss, not the bytes
        others = reader.get_many(NS, keys[:10] + keys[11:])
        assert all(loc is not None for loc in others)  # the chunk's other blocks are still served
        reader.release([loc.lease_id for loc in others if loc is not None])
        removed = reader.removals_since(0, NS)
        assert [(r.key, r.why) for r in removed.items] == [(keys[10], "deleted")]

        # Nothing new lands on the quarantined chunk; the server keeps serving.
        for i in range(60):
            r = writer.reserve(NS, i.to_bytes(32, "big"), 96 * 1024)
            assert not any(chunk <= off < chunk + CHUNK for off, _n in r.extents)
            writer.commit(r.token, zeros_crc(96 * 1024))
        metrics = m.admin("/metrics").decode()
        assert "beluga_mds_poison_dropped_blocks_total 1.0" in metrics
        assert "beluga_mds_quarantined_bytes 2.097152e+06" in metrics
        reader.close()
        writer.close()
        pool.close()
