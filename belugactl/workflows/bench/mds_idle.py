"""`bench mds --idle`: what an idle metadata server costs and how fast it answers when a request comes.

A server with no request in flight either busy-polls its rings (`--spin-after-ms`: the first
milliseconds after a request, so a burst is answered at once) or waits idle, looking at every ring
every 0.25 ms (docs/dataplane.md, "The server loop and the native fast path"). The figures an
operator sizes a host with: the CPU the server takes while nobody asks (a share of one core), with
every ring of the rack laid out, and a PING's round trip after a quiet spell, which is what a pool
hit's first request pays. The
idle-waiting server (`--spin-after-ms 0`, the CPU demo's setting) is printed beside the same server
busy-polling for the whole run (the baseline: the fastest answer, a whole core)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from belugactl.workflows.bench.server import bench_rack, running_server

PROCESS_RINGS = 2  # the bench rack's scheduler and worker; the rest are spare rings
SLOTS_PER_RING = 256  # examples/beluga-rack.yaml's: the idle scan's cost grows with the slots
SETTINGS = {"idle_wait": "0", "busy_poll": "60000"}  # --spin-after-ms of each server


def bench_idle_server(
    *, rings: int = 4, seconds: float = 5.0, pings: int = 100, quiet_ms: float = 50.0
) -> dict[str, Any]:
    """Both servers, one after the other, on a fresh pool laid out with `rings` rings."""
    results = {name: _one_server(spin, rings, seconds, pings, quiet_ms) for name, spin in SETTINGS.items()}
    idle, busy = results["idle_wait"], results["busy_poll"]
    busy_ping = busy["ping_us"]["p50"]
    return {
        "rings": rings,
        "slots_per_ring": SLOTS_PER_RING,
        "seconds": seconds,
        "quiet_ms": quiet_ms,
        "pings": pings,
        **results,
        "idle_wait_over_busy_poll": {
            "cpu_share": round(idle["cpu_share"] / busy["cpu_share"], 3) if busy["cpu_share"] else None,
            "ping_p50_us": round(idle["ping_us"]["p50"] / busy_ping, 2) if busy_ping else None,
        },
    }


def _one_server(spin_after_ms: str, rings: int, seconds: float, pings: int, quiet_ms: float) -> dict[str, Any]:
    import psutil

    from belugactl.dataplane.client import connect
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.pool.mapping import PoolMapping

    with tempfile.TemporaryDirectory(prefix="belugactl-bench-") as tmp:
        manifest = Path(tmp) / "rack.yaml"
        manifest.write_text(bench_rack(spare_rings=rings - PROCESS_RINGS, slots_per_ring=SLOTS_PER_RING))
        pool_path = create_file_pool(Path(tmp) / "pool.bin", manifest)
        with running_server(manifest, pool_path, extra=["--spin-after-ms", spin_after_ms]) as srv:
            proc = psutil.Process(srv["pid"])
            time.sleep(min(1.0, seconds))  # start-up's own work is not idle time
            cpu0, t0 = _cpu_s(proc), time.monotonic()
            time.sleep(seconds)
            share = (_cpu_s(proc) - cpu0) / (time.monotonic() - t0)
            pool = PoolMapping.open(pool_path)
            client = connect(f"cxl://{pool_path}#0", pool=pool, timeout_s=5.0)
            try:
                samples = []
                for _ in range(pings):
                    time.sleep(quiet_ms / 1000)
                    t = time.perf_counter_ns()
                    client.ping(b"x")
                    samples.append((time.perf_counter_ns() - t) / 1000)
            finally:
                client.close()
                pool.close()
    samples.sort()
    return {
        "spin_after_ms": int(spin_after_ms),
        "cpu_share": round(share, 4),
        "ping_us": {
            "p10": round(samples[len(samples) // 10], 1),
            "p50": round(statistics.median(samples), 1),
            "p90": round(samples[min(len(samples) - 1, 9 * len(samples) // 10)], 1),
        },
    }


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return t.user + t.system
