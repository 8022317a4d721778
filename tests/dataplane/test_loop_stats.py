"""The loop's own pause figures (mds/loop_stats.py): /stats loop.longest_turn_us and loop.ring_pass_us,
the names `bench mds --scale` reads, and /metrics' loop histogram."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.loop_stats import WINDOW_S, LoopStats
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc.protocol import Op
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.bench.mds_scale import SERVER_LONGEST_TURN_US, SERVER_RING_PASS_US

PAUSE_S = 0.05


def test_turns_fill_the_histogram_and_the_recent_window_forgets() -> None:
    now = [0.0]
    stats = LoopStats(clock=lambda: now[0])
    stats.turn(0.002, "request op 9")
    stats.turn(0.00001)
    s = stats.stats()
    assert s["longest_turn_us"] == 2000.0 and s["longest_turn_what"] == "request op 9"
    assert s["longest_turn_recent_us"] == 2000.0 and s["turns"] == 2
    assert sum(s["turn_seconds"]["counts"]) == 2
    now[0] += WINDOW_S / 2 + 0.1  # the pause is in the previous half window: still recent
    assert stats.stats()["longest_turn_recent_us"] == 2000.0
    now[0] += WINDOW_S + 0.1  # a whole window later: no longer recent, still the longest since start
    s = stats.stats()
    assert s["longest_turn_recent_us"] == 0.0 and s["longest_turn_us"] == 2000.0
    assert s["ring_pass_us"] is None
    stats.ring_pass(3e-6)
    stats.ring_pass(5e-6)
    s = stats.stats()
    assert s["ring_pass_us"] == 5.0 and s["ring_pass_mean_us"] == 4.0


def _dig(doc: dict, path: tuple[str, ...]) -> object:
    for k in path:
        doc = doc[k]
    return doc


def test_a_slow_request_and_a_slow_housekeeping_are_the_loops_turns(pool_path: Path, monkeypatch) -> None:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None))
    server.start()
    real_handle = server.service.handle

    def slow_handle(op, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        if op == Op.RESERVE:
            time.sleep(PAUSE_S)
        return real_handle(op, *a, **kw)

    monkeypatch.setattr(server.service, "handle", slow_handle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        c = connect(f"cxl://{pool.path}#1", pool=pool, timeout_s=10)
        c.reserve("m/tp0", b"k" * 32, 4096)
        deadline = time.monotonic() + 10
        while server.loop.passes == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the next housekeeping measures a ring pass
        server.publish_snapshot()
        snap = server.snapshot
        longest = _dig(snap, SERVER_LONGEST_TURN_US)
        assert isinstance(longest, float) and longest >= PAUSE_S * 1e6  # the sleep is a lower bound
        assert snap["loop"]["longest_turn_what"] == f"request op {int(Op.RESERVE)}"
        assert _dig(snap, SERVER_RING_PASS_US) is not None and snap["loop"]["ring_passes_measured"] >= 1

        # The loop's own work (here the housekeeping) is a turn too, and becomes the longest.
        real_expire = server.index.expire
        monkeypatch.setattr(server.index, "expire", lambda: (time.sleep(2 * PAUSE_S), real_expire())[1])
        deadline = time.monotonic() + 10
        while server.loop.longest_what != "loop" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.loop.longest_what == "loop" and server.loop.longest_s >= 2 * PAUSE_S
        c.close()
    finally:
        server.stop()
        thread.join(10)
        pool.close()


def test_metrics_carry_the_loop_histogram(pool_path: Path) -> None:
    from belugactl.dataplane.mds.admin import _Collector

    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None))
    server.start()
    server.loop.turn(0.003)
    server.loop.ring_pass(2e-6)
    server.publish_snapshot()
    samples = {s.name + str(sorted(s.labels.items())): s.value for f in _Collector(server).collect() for s in f.samples}
    assert samples["beluga_mds_loop_turn_seconds_count[]"] >= 1
    assert samples["beluga_mds_loop_turn_seconds_bucket[('le', '0.002')]"] < samples[
        "beluga_mds_loop_turn_seconds_bucket[('le', '0.005')]"
    ]
    assert samples["beluga_mds_loop_longest_turn_seconds[]"] >= 0.003
    assert samples["beluga_mds_loop_ring_pass_seconds[]"] == 2e-6
    server.close()
    pool.close()
