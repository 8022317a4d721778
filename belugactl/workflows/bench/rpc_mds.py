"""The data plane's benchmarks: `bench rpc` (CXL-RPC vs TCP, same server, same request) and `bench mds`.

Benchmarks are commands, not tests: they print what they measured next to the baseline and the
targets, and never assert.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from belugactl.workflows.bench.server import BENCH_RACK, running_server

NAMESPACE = "bench/tp0"
KEY_LEN = 24  # 32 B header + 8 B lookup fields + 24 B key = a 64 B request
QDS = (1, 8, 32, 128)
TARGETS = {"cxl_qd1_p50_us": 2.0, "tcp_over_cxl_p50": 25.0, "cxl_qd128_mops": 2.0}
CALIBRATION = {
    "shm_pingpong_python_p50_us": 0.36,
    "tcp_loopback_echo_python_p50_us": 51.0,
    "paper_cxl_rpc_qd1_us": 2.11,
    "paper_cxl_rpc_qd128_mops": 12.13,
}


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


def _latency(client: Any, keys: list[bytes], n: int) -> dict[str, float]:
    perf = time.perf_counter_ns
    lookup = client.lookup_prefix
    for _ in range(min(2000, n)):  # first rounds uncounted: caches filled, the server busy-polling
        lookup(NAMESPACE, keys)
    samples = []
    for _ in range(n):
        t = perf()
        lookup(NAMESPACE, keys)
        samples.append(perf() - t)
    samples.sort()
    return {"p50_us": _percentile(samples, 0.5), "p99_us": _percentile(samples, 0.99), "samples": n}


def _throughput(client: Any, payload: bytes, qd: int, seconds: float) -> float:
    """Requests/s with `qd` lookups in flight on one connection (raw transport, same message)."""
    from belugactl.dataplane.rpc.protocol import Op

    t = client.transport
    epoch = client._epoch32
    timeout = int(client.timeout_s * 1e9)
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(qd):
            t.submit(Op.LOOKUP_PREFIX, epoch, payload)
        for _ in range(qd):
            code, _e, _r = t.collect(timeout)
            if code:
                raise RuntimeError(f"lookup failed with code {code}")
        done += qd
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start)


def _native_throughput(client: Any, payload: bytes, qd: int, seconds: float) -> float | None:
    """Requests/s with `qd` in flight, generated in C (the server's capacity without a Python client)."""
    from array import array

    from belugactl.dataplane import native
    from belugactl.dataplane.rpc.protocol import Op

    burst = native.optional("rpc_burst")
    t = client.transport
    if burst is None or t.kind != "cxl":
        return None
    offsets = array("q", t._offsets)
    total = 2_000  # per native call; repeated until `seconds` have passed
    done = 0
    elapsed_ns = 0
    while elapsed_ns < seconds * 1e9:
        seq = t._seq  # rpc_burst keeps seq % slots == slot, as the server expects
        op = int(Op.LOOKUP_PREFIX)
        n, ns = burst(t.buf, offsets, seq, client._epoch32, op, payload, qd, total, 5 * 10**9, t.flush)
        t._seq = seq + n
        done += n
        elapsed_ns += ns
    return done / (elapsed_ns / 1e9)


def bench_rpc(
    *,
    samples: int = 20000,
    seconds: float = 0.5,
    pin: bool = True,
    flush: bool = False,
    lookup_keys: int = 0,
    idle_ms: Sequence[float] = (0.0,),
    lookup_rounds: int = 20,
) -> dict[str, Any]:
    """The QD1 latency and the throughput of one small lookup over CXL-RPC and TCP; with `lookup_keys`,
    also a pool hit's GET_MANY burst of that many keys and its lease release after each of `idle_ms`
    (`workflows/bench/rpc_lookups.py`)."""
    from belugactl.dataplane import native
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.pool.mapping import PoolMapping

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = pin and len(cpus) >= 2
    with tempfile.TemporaryDirectory(prefix="belugactl-bench-") as tmp:
        manifest = Path(tmp) / "rack.yaml"
        manifest.write_text(BENCH_RACK)
        pool_path = create_file_pool(Path(tmp) / "pool.bin", manifest)
        old_affinity = None
        if pinned:
            old_affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cpus[0]})
        try:
            with running_server(manifest, pool_path, cpu=cpus[1] if pinned else None) as srv:
                pool = PoolMapping.open(pool_path)
                if flush:
                    pool.needs_flush = True  # measure the cost of the flushes a shared devdax pool needs
                key = bytes(random.getrandbits(8) for _ in range(KEY_LEN))
                results: dict[str, Any] = {}
                for name, address in (("cxl", f"cxl://{pool_path}#0"), ("tcp", srv["rpc"])):
                    client = connect(address, pool=pool if name == "cxl" else None, timeout_s=5.0)
                    try:
                        ns = client._ns_id(NAMESPACE)
                        with contextlib.suppress(Exception):
                            r = client.reserve(NAMESPACE, key, 4096)
                            client.commit(r.token, native.crc32c(bytes(4096)))  # a fresh pool's zeros
                        payload = p.encode_lookup(ns, [key])
                        request_bytes = p.HEADER_SIZE + len(payload)
                        lat = _latency(client, [key], samples)
                        thr = {str(qd): _throughput(client, payload, qd, seconds) for qd in QDS}
                        results[name] = {"qd1": lat, "ops_per_s": thr, "request_bytes": request_bytes}
                        if name == "cxl":
                            native_thr = {str(qd): _native_throughput(client, payload, qd, seconds) for qd in QDS}
                            if native_thr["1"] is not None:
                                results[name]["ops_per_s_native_client"] = native_thr
                    finally:
                        client.close()
                lookups = None
                if lookup_keys:
                    lookups = _bench_lookups(pool, pool_path, lookup_keys, idle_ms, lookup_rounds)
                pool.close()
        finally:
            if old_affinity is not None:
                os.sched_setaffinity(0, old_affinity)
    cxl, tcp = results["cxl"], results["tcp"]
    ratios = {
        "tcp_over_cxl_p50": round(tcp["qd1"]["p50_us"] / cxl["qd1"]["p50_us"], 2),
        "tcp_over_cxl_p99": round(tcp["qd1"]["p99_us"] / cxl["qd1"]["p99_us"], 2),
        **{
            f"cxl_over_tcp_ops_qd{qd}": round(cxl["ops_per_s"][str(qd)] / tcp["ops_per_s"][str(qd)], 2) for qd in QDS
        },
    }
    server_side = cxl.get("ops_per_s_native_client", cxl["ops_per_s"])
    measured = {
        "cxl_qd1_p50_us": cxl["qd1"]["p50_us"],
        "tcp_over_cxl_p50": ratios["tcp_over_cxl_p50"],
        "cxl_qd128_mops": server_side["128"] / 1e6,
    }
    return {
        "benchmark": "rpc",
        "request": "LOOKUP_PREFIX of one 24-byte key (64 B message), answered from the index",
        "method": "QD1 latency through the client library; ops_per_s: the Python client pipelining QD requests on "
        "one ring/connection; ops_per_s_native_client: a C load generator on one ring (the server's capacity)",
        "pool": "file-backed, " + ("flushes on (as on a shared write-back devdax pool)" if flush else "no flushes"),
        "native_helper": native.AVAILABLE,
        # Spin-polling needs both sides on a CPU at once: read the figures next to the machine's load.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": len(cpus) or os.cpu_count(),
        "pinned_cpus": [cpus[0], cpus[1]] if pinned else None,
        "cxl": cxl,
        "tcp": tcp,
        "ratios": ratios,
        "targets": {
            k: {"target": v, "measured": round(measured[k], 3), "met": _met(k, measured[k], v)}
            for k, v in TARGETS.items()
        },
        "calibration": CALIBRATION,
        "lookups": lookups,
    }


def _bench_lookups(
    pool: Any, pool_path: Path, keys: int, idle_ms: Sequence[float], rounds: int
) -> dict[str, Any]:
    """`rpc_lookups.measure_lookups` on its own ring (the first spare), keys committed over another."""
    from belugactl.dataplane.client import connect
    from belugactl.workflows.bench.rpc_lookups import commit_keys, measure_lookups

    writer = connect(f"cxl://{pool_path}#0", pool=pool, timeout_s=5.0)
    reader = connect(f"cxl://{pool_path}#1", pool=pool, timeout_s=5.0)
    try:
        committed = commit_keys(writer, keys)
        return measure_lookups(reader, committed, idle_ms, rounds)
    finally:
        reader.close()
        writer.close()


def _met(name: str, value: float, target: float) -> bool:
    return value <= target if name.endswith("_us") else value >= target


# --- bench mds -----------------------------------------------------------------------------------


def bench_mds(
    *,
    ops: int = 200_000,
    seed: int = 1,
    ways: int = 4,
    granularity: int = 2 << 20,
    batch_blocks: int = 62,
    batch_rounds: int = 100,
    pin: bool = True,
) -> dict[str, Any]:
    """Index operations per second (put/commit/lookup mix), allocator utilization under churn,
    bytes per interleave zone with software interleave next to the same run without it, and a save
    of `batch_blocks` blocks as single reserves+commits against one batched burst on a real server
    (`batch_rounds` 0 skips it)."""
    from belugactl.dataplane.mds.allocator import Allocator
    from belugactl.dataplane.mds.index import IndexConfig, KVIndex

    rng = random.Random(seed)
    area = 1 << 30
    # Mix: 70 % prefix lookups of 8 keys, 15 % reserve+commit, 10 % get, 5 % release. The index's
    # allocator interleaves as the server's does with `pool.interleave.mode: software` (ways > 1).
    index = KVIndex(
        Allocator(2 << 20, area, ways=ways, granularity=granularity), IndexConfig(high_watermark=0.9, low_watermark=0.8)
    )
    ns = index.open_namespace("bench")
    keys = [rng.randbytes(32) for _ in range(20000)]
    block = 160 << 10
    counts = {"lookup_prefix": 0, "put": 0, "get": 0, "release": 0}
    leases: list[int] = []
    start = time.perf_counter()
    for _ in range(ops):
        r = rng.random()
        if r < 0.70:
            i = rng.randrange(len(keys) - 8)
            n, lease = index.lookup_prefix(ns, keys[i : i + 8])
            if lease:
                leases.append(lease)
            counts["lookup_prefix"] += 1
        elif r < 0.85:
            k = keys[rng.randrange(len(keys))]
            with contextlib.suppress(Exception):
                token, _a = index.reserve(ns, k, block)
                index.commit(token)
            counts["put"] += 1
        elif r < 0.95:
            found = index.get(ns, keys[rng.randrange(len(keys))])
            if found:
                leases.append(found[1])
            counts["get"] += 1
        else:
            index.release(leases[-64:])
            del leases[-64:]
            counts["release"] += 1
    elapsed = time.perf_counter() - start
    index_stats = index.stats()

    # Allocator churn: mixed block sizes (three models' block sizes plus noise), random frees,
    # fill until the first failure, measure how much of the area holds live bytes.
    churn = Allocator(2 << 20, area)
    sizes = [160 << 10, 2_621_440, 327_680, 4096 * 5, 64 << 10]
    live: list[Any] = []
    failures = 0
    samples = []
    for step in range(60_000):
        if live and rng.random() < 0.45:
            churn.free(live.pop(rng.randrange(len(live))))
        else:
            a = churn.alloc(rng.choice(sizes) + rng.randrange(0, 4096))
            if a is None:
                failures += 1
                if live:
                    churn.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(a)
        if step % 1000 == 999:
            samples.append(churn.requested / churn.capacity)
    st = churn.stats()
    interleave = _bench_interleave(rng, area, ways, granularity)
    batched = None
    if batch_rounds > 0:
        from belugactl.workflows.bench.batched_puts import bench_batched_puts

        batched = bench_batched_puts(blocks=batch_blocks, rounds=batch_rounds, pin=pin)
    return {
        "benchmark": "mds",
        "index": {
            "ops": ops,
            "seconds": round(elapsed, 3),
            "ops_per_s": round(ops / elapsed),
            "mix": counts,
            "entries": index_stats["entries"],
            "evictions": index_stats["evictions"],
            "utilization": index_stats["allocator"]["utilization"],  # type: ignore[index]
            # Bytes the index holds per interleave zone at the end (one zone when interleave is off).
            "zone_bytes": index_stats["allocator"]["interleave"]["zone_bytes"],  # type: ignore[index]
        },
        "allocator_churn": {
            "area_bytes": area,
            "alloc_failures": failures,
            "live_bytes_over_area_peak": round(max(samples), 4) if samples else 0.0,
            "live_bytes_over_area_end": round(churn.requested / churn.capacity, 4),
            "fill_of_handed_out_blocks": st["fill"],
            "carved_idle_bytes": st["carved_idle_bytes"],
            "classes_in_use": len(st["classes"]),  # type: ignore[arg-type]
            "chunks_returned": st["chunks_returned"],
        },
        "interleave": interleave,
        "batched_puts": batched,
    }


def _bench_interleave(rng: random.Random, area: int, ways: int, granularity: int) -> dict[str, Any]:
    """Save-like traffic (runs of consecutive blocks of one size, with frees) on two allocators, one
    with software interleave over `ways` zones and one without; bytes live in each zone at the end.

    Without interleave the bump allocator fills the area from its start, so one device would serve
    every read of a request's blocks; with it, consecutive blocks land on consecutive devices.
    """
    from belugactl.dataplane.mds.allocator import Allocator

    runs = []
    for _ in range(400):
        runs.append((rng.choice([160 << 10, 327_680, 64 << 10, 2_621_440]), rng.randrange(8, 64)))
    # The zones are the software allocator's own (equal, granule-aligned), for both runs: the devices
    # are the same whichever policy places the blocks. Bytes outside every zone count in none.
    zoned = Allocator(2 << 20, area, ways=ways, granularity=granularity)
    ranges = zoned.zone_ranges()
    ways = zoned.ways
    out: dict[str, Any] = {
        "ways": ways,
        "granularity": granularity,
        "zones": [{"offset": o, "size": n} for o, n in ranges],
        "unused_bytes": zoned.unused_bytes,
    }

    def zone_bytes(extents: list[tuple[int, int]], into: list[int]) -> None:
        for off, n in extents:
            # Cut at zone borders: without interleave a coalesced extent can span two zones.
            while n:
                z = zoned.zone_of(off)
                start, size = ranges[z]
                take = n if z == ways - 1 else min(n, start + size - off)
                into[z] += take
                off, n = off + take, n - take

    for name, w in (("software", ways), ("none", 1)):
        a = Allocator(2 << 20, area, ways=w, granularity=granularity)
        live: list[Any] = []
        picks = random.Random(7)
        placed = [0] * ways  # every byte ever handed out, by zone: what the placement policy decides
        for size, count in runs:
            for _ in range(count):
                got = a.alloc(size)
                if got is None:
                    break
                live.append(got)
                zone_bytes(got.extents, placed)
            while live and a.used > area // 2:  # stay half full: frees and reuse, not one fill
                a.free(live.pop(picks.randrange(len(live))))
        per_zone = [0] * ways
        for g in live:
            zone_bytes(g.extents, per_zone)
        # A request's first 16 blocks: how many zones they span (the devices a load reads in parallel).
        sample = [a.alloc(160 << 10) for _ in range(16)]
        spread = len({zoned.zone_of(g.extents[0][0]) for g in sample if g})
        # One Qwen-32B block (64 layers x K,V x 32 KiB = 4 MiB): the zones its first, second, ...
        # granule lie in, in the order a layer-wise load reads them.
        qwen = a.alloc(4 << 20)
        granule_zones = _granule_zones(qwen.extents, granularity, zoned.zone_of) if qwen else []
        out[name] = {
            "placed_zone_bytes": placed,
            "placed_min_over_max": round(min(placed) / max(placed), 4) if max(placed) else 0.0,
            "zone_bytes": per_zone,  # live at the end (random frees add noise)
            "min_over_max": round(min(per_zone) / max(per_zone), 4) if max(per_zone) else 0.0,
            "zones_spanned_by_16_consecutive_blocks": spread,
            "zones_of_a_4mib_block_by_granule": granule_zones,
        }
    return out


def _granule_zones(extents: list[tuple[int, int]], granularity: int, zone_of: Any) -> list[int]:
    """The zone of each successive `granularity` bytes of a block (the zone of its first byte)."""
    zones: list[int] = []
    pos = 0
    for off, n in extents:
        for at in range(-pos % granularity, n, granularity):
            zones.append(zone_of(off + at))
        pos += n
    return zones
