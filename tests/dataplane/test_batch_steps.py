"""Batches in bounded steps (issue 31 item 1): the server tells clients in HELLO how many keys or
tokens a RESERVE_MANY or COMMIT_MANY should carry, answers a longer RESERVE_MANY in part (the
client asks again for the rest), and after each batch step lets the other rings and connections go
first. A save of any size then holds the loop for one step at a time."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import Reservation, connect
from belugactl.dataplane.mds.service import BATCH_ITEMS
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_batched_puts import EPOCH, keys, reserve_many, service
from tests.dataplane.test_slots import NS, make_server
from tests.support.mds_process import start_mds


def test_hello_tells_the_step_and_an_older_reply_reads_as_no_advice() -> None:
    s = service()
    code, rep = s.handle(Op.HELLO, 0, p.encode_hello(1), 4096, 1)
    assert code == 0 and p.decode_hello_batch(rep) == BATCH_ITEMS
    assert p.decode_hello_reply(rep)[0] == EPOCH  # the fields before it are read as ever
    older = struct.pack("<QIIII", 5, 42, 224, 30000, 10000)
    assert p.decode_hello_batch(older) == 0 and p.decode_hello_batch(older[:16]) == 0


def test_a_reserve_many_past_the_step_is_answered_in_part_and_leaks_nothing() -> None:
    s = service(chunks=64)
    ns = s.index.open_namespace("m/tp0")
    items = [(k, 4096) for k in keys(3 * BATCH_ITEMS + 5)]
    code, answered = reserve_many(s, ns, items, max_reply=1 << 20)
    assert code == 0 and len(answered) == BATCH_ITEMS and all(c == 0 for c, _t, _e in answered)
    assert len(s.index.pending) == BATCH_ITEMS  # the keys past the step were not reserved


@pytest.mark.process
@pytest.mark.timeout(120)
def test_a_save_of_many_blocks_goes_in_steps_and_every_block_is_there(manifest_path: Path, pool_path: Path) -> None:
    n, count = 4096, 3 * BATCH_ITEMS + 7
    with start_mds(manifest_path, pool_path, "--fence-grace", "0") as srv:
        pool = PoolMapping.open(pool_path)
        c = connect(srv.tcp, timeout_s=10.0)
        c.clear_namespace("m/tp0")
        assert c.batch_items == BATCH_ITEMS
        ks = keys(count, tag=b"s")
        m0 = c.messages
        got = c.reserve_many("m/tp0", [(k, n) for k in ks])
        assert all(isinstance(r, Reservation) for r in got), got
        commits = []
        for k, r in zip(ks, got, strict=True):
            data = (k * (n // len(k) + 1))[:n]
            pos = 0
            for off, length in r.extents:
                pool.write(off, data[pos : pos + length])
                pos += length
            commits.append((r.token, native.crc32c(data)))
        assert c.commit_many(commits) == [Code.OK] * count
        steps = -(-count // BATCH_ITEMS)
        assert c.messages - m0 == 2 * steps  # each batch cut at the server's step, no key sent twice
        locs = c.get_many("m/tp0", ks)
        assert all(loc is not None and loc.nbytes == n for loc in locs)
        c.release([loc.lease_id for loc in locs if loc])
        stats = srv.stats_since(time.time())
        assert stats["tcp"]["turns_deferred"] >= 1  # pipelined steps were served over several turns
        c.close()
        pool.close()


def test_after_a_batch_step_the_other_rings_go_first(pool_path: Path) -> None:
    pool, srv = make_server(pool_path)
    try:
        busy, other = CxlTransport(pool, 1), CxlTransport(pool, 2)
        for t in (busy, other):
            t.submit(Op.HELLO, 0, p.encode_hello(7))
            assert srv.poll_once(NS)
            assert t.collect(NS)[0] == 0
        ns = srv.index.open_namespace("m/tp0")
        # Two batch steps queued on one ring, then a request on another that Python answers too (the
        # native fast path answers pings and lookups of every ring before it hands a slot to Python).
        for tag in (b"a", b"b"):
            busy.submit(Op.RESERVE_MANY, srv.epoch, p.encode_reserve_many(ns, [(k, 4096) for k in keys(2, tag)]))
        other.submit(Op.STATS, srv.epoch, b"")
        counts, ring = srv.service._op_counts, srv.ring
        while counts[Op.RESERVE_MANY] + counts[Op.STATS] < 1:
            ring.serve(NS)
        assert counts[Op.RESERVE_MANY] == 1 and counts[Op.STATS] == 0
        while counts[Op.RESERVE_MANY] + counts[Op.STATS] < 2:
            ring.serve(NS)
        # The next request served is the other ring's, not the busy ring's second step.
        assert counts[Op.RESERVE_MANY] == 1 and counts[Op.STATS] == 1
        assert other.collect(NS)[0] == 0
        while counts[Op.RESERVE_MANY] < 2:
            ring.serve(NS)
        assert [busy.collect(NS)[0] for _ in range(2)] == [0, 0]
    finally:
        srv.close()
        pool.close()
