"""`bench mds`'s side-by-side of a request's save: N single RESERVE+COMMIT round trips against one
RESERVE_MANY burst and one COMMIT_MANY burst, on a real metadata server over CXL-RPC and TCP.

What the vLLM connector's save costs in metadata, without the copy: a 2000-token request at 32
tokens a block is 62 blocks. Both ways run on the same server, rounds interleaved, each round on
fresh keys; the namespace is cleared between rounds (untimed) so eviction never runs.
"""

from __future__ import annotations

import functools
import json
import os
import random
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

NAMESPACE = "bench/save"
KEY_LEN = 32  # a vLLM sha256 block hash
BLOCK_BYTES = 64 << 10


@functools.cache
def _zeros_crc() -> int:
    """The CRC32C every benchmark block commits: it writes no bytes, so a block is its fresh pool's zeros."""
    from belugactl.dataplane import native

    return native.crc32c(bytes(BLOCK_BYTES))


def bench_batched_puts(*, blocks: int = 62, rounds: int = 100, pin: bool = True) -> dict[str, Any]:
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.pool.mapping import PoolMapping
    from belugactl.workflows.bench.server import BENCH_RACK, running_server

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = pin and len(cpus) >= 2
    rng = random.Random(3)
    with tempfile.TemporaryDirectory(prefix="belugactl-bench-") as tmp:
        manifest = Path(tmp) / "rack.yaml"
        manifest.write_text(BENCH_RACK)
        pool_path = create_file_pool(Path(tmp) / "pool.bin", manifest)
        old_affinity = os.sched_getaffinity(0) if pinned else None
        if pinned:
            os.sched_setaffinity(0, {cpus[0]})
        try:
            with running_server(manifest, pool_path, cpu=cpus[1] if pinned else None) as srv:
                pool = PoolMapping.open(pool_path)
                try:
                    results = _both_transports(srv, pool, pool_path, blocks, rounds, rng)
                finally:
                    pool.close()
        finally:
            if old_affinity is not None:
                os.sched_setaffinity(0, old_affinity)
    return {
        "blocks_per_save": blocks,
        "rounds": rounds,
        "block_bytes": BLOCK_BYTES,
        "pinned_cpus": [cpus[0], cpus[1]] if pinned else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
        **results,
    }


_SERVER_OPS = {"single": ("RESERVE", "COMMIT"), "batched": ("RESERVE_MANY", "COMMIT_MANY")}


def _both_transports(
    srv: dict[str, Any], pool: Any, pool_path: Path, blocks: int, rounds: int, rng: random.Random
) -> dict[str, Any]:
    from belugactl.dataplane.client import connect

    results: dict[str, Any] = {}
    seen = _service_seconds(srv["admin"], time.time())
    for name, address in (("cxl", f"cxl://{pool_path}#0"), ("tcp", srv["rpc"])):
        client = connect(address, pool=pool if name == "cxl" else None, timeout_s=5.0)
        try:
            results[name] = _compare(client, blocks, rounds, rng)
        finally:
            client.close()
        now = _service_seconds(srv["admin"], time.time())
        # The server's own time per save (its per-opcode histograms; the uncounted first round included):
        # what the requests cost it, whatever the scheduler did to the spinning client meanwhile.
        for way, ops in _SERVER_OPS.items():
            spent = sum(now.get(op, 0.0) - seen.get(op, 0.0) for op in ops)
            results[name][way]["server_us_per_save"] = round(spent / (rounds + 1) * 1e6, 1)
        seen = now
    return results


def _compare(client: Any, blocks: int, rounds: int, rng: random.Random) -> dict[str, Any]:
    """Rounds of one save each way, interleaved. Rates come from the median save: on a shared
    machine a spinning client or server that loses its CPU for a scheduler tick adds milliseconds
    to a few saves, which would swamp a mean."""
    times: dict[str, list[float]] = {"single": [], "batched": []}
    sent = {"single": (0, 0), "batched": (0, 0)}
    client.clear_namespace(NAMESPACE)  # opens it, untimed
    for r in range(rounds + 1):  # round 0 fills caches on both paths and is not counted
        for way in ("single", "batched") if r % 2 else ("batched", "single"):
            keys = [rng.randbytes(KEY_LEN) for _ in range(blocks)]
            m0, t0 = client.messages, client.round_trips
            start = time.perf_counter()
            committed = _save_single(client, keys) if way == "single" else _save_batched(client, keys)
            elapsed = time.perf_counter() - start
            if committed != blocks:
                raise RuntimeError(f"{way} save committed {committed} of {blocks} blocks")
            if r:
                times[way].append(elapsed)
                m, t = sent[way]
                sent[way] = (m + client.messages - m0, t + client.round_trips - t0)
            client.clear_namespace(NAMESPACE)
    out: dict[str, Any] = {}
    for way in ("single", "batched"):
        median = statistics.median(times[way])
        out[way] = {
            "block_puts_per_s": round(blocks / median),
            "saves_per_s": round(1 / median, 1),
            "messages_per_save": sent[way][0] / rounds,
            "round_trips_per_save": sent[way][1] / rounds,
            "us_per_save_median": round(median * 1e6, 1),
            "us_per_save_mean": round(statistics.fmean(times[way]) * 1e6, 1),
        }
    out["batched_over_single"] = round(out["batched"]["block_puts_per_s"] / out["single"]["block_puts_per_s"], 2)
    return out


def _service_seconds(admin: str, after: float, timeout_s: float = 5.0) -> dict[str, float]:
    """Seconds the server spent serving each opcode, from an admin snapshot taken after `after`
    (the server refreshes it every 100 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(admin + "/stats", timeout=timeout_s) as r:  # noqa: S310 - loopback
            doc = json.loads(r.read())
        if doc.get("time", 0) > after or time.monotonic() > deadline:
            return {op: float(h.get("sum", 0.0)) for op, h in doc.get("latency", {}).items()}
        time.sleep(0.05)


def _save_single(client: Any, keys: list[bytes]) -> int:
    """What the connector did before RESERVE_MANY: a reserve per block, then a commit per block."""
    tokens = [client.reserve(NAMESPACE, k, BLOCK_BYTES).token for k in keys]
    for token in tokens:
        client.commit(token, checksum=_zeros_crc())
    return len(tokens)


def _save_batched(client: Any, keys: list[bytes]) -> int:
    got = client.reserve_many(NAMESPACE, [(k, BLOCK_BYTES) for k in keys])
    tokens = [r.token for r in got if not isinstance(r, int)]
    crc = _zeros_crc()
    codes = client.commit_many([(token, crc) for token in tokens])
    return [int(c) for c in codes].count(0)
