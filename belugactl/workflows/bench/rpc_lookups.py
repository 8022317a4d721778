"""`bench rpc --lookup-keys N --idle-ms 0,1,100`: a pool hit's metadata as the vLLM connector makes it,
after the client sat idle.

A pool hit costs the scheduler one GET_MANY burst for the prompt's keys (each with a read lease) and the
worker one lease release after its copy, waited for or sent without waiting for the reply (a no-wait
release: what a load that ended inside the lease's trust window does). Each is timed after each idle
pause, interleaved round by round so every pause sees the same machine; the first pause is the baseline
the others are compared with (a client and server that come back from an idle spell run cold: on a VM a
vCPU that idled, on any machine caches another job filled)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

NAMESPACE = "bench/lookups"
KEY_BYTES = 32  # vLLM's block hash (sha256)
BLOCK_BYTES = 4096  # the extent each key's block holds: small, the lookup does not read it
OPERATIONS = ("lookup", "release", "release_nowait")


def commit_keys(client: Any, count: int) -> list[bytes]:
    """`count` random keys committed to the benchmark's namespace: a `count`-block prompt in the pool."""
    from belugactl.dataplane import native

    keys = [os.urandom(KEY_BYTES) for _ in range(count)]
    # The benchmark writes no bytes: each block is the zeros of its fresh file pool, and carries their CRC.
    crc = native.crc32c(bytes(BLOCK_BYTES))
    for key in keys:
        client.commit(client.reserve(NAMESPACE, key, BLOCK_BYTES).token, crc)
    return keys


def _label(ms: float) -> str:
    return f"{ms:g}"


def _lookup(client: Any, keys: list[bytes]) -> tuple[int, list[int]]:
    """One GET_MANY burst: its nanoseconds and the lease ids it took (one per key found)."""
    t0 = time.perf_counter_ns()
    located = client.get_many_tuples(NAMESPACE, keys)
    ns = time.perf_counter_ns() - t0
    return ns, [loc[1] for loc in located if loc is not None]


def measure_lookups(client: Any, keys: list[bytes], idle_ms: Sequence[float], rounds: int) -> dict[str, Any]:
    """Median microseconds of each operation after each idle pause, and each over the first pause's."""
    from belugactl.dataplane.rpc import protocol as p

    samples: dict[str, dict[str, list[int]]] = {op: {_label(ms): [] for ms in idle_ms} for op in OPERATIONS}
    refused = 0
    for _ in range(rounds):
        for ms in idle_ms:
            label = _label(ms)
            time.sleep(ms / 1000)
            ns, leases = _lookup(client, keys)
            samples["lookup"][label].append(ns)
            t0 = time.perf_counter_ns()
            client.release(leases)
            samples["release"][label].append(time.perf_counter_ns() - t0)

            time.sleep(ms / 1000)
            ns, leases = _lookup(client, keys)
            samples["lookup"][label].append(ns)
            t0 = time.perf_counter_ns()
            sent = client.release_nowait(leases)
            elapsed = time.perf_counter_ns() - t0
            if sent:
                samples["release_nowait"][label].append(elapsed)
            else:  # outside the trust window or no room on the ring: released the usual way, not counted
                refused += 1
                client.release(leases)
            client.collect_replies()  # the no-wait replies, outside the timing
    medians = {
        op: {label: round(statistics.median(xs) / 1000, 1) if xs else None for label, xs in per.items()}
        for op, per in samples.items()
    }
    base = _label(idle_ms[0])
    ratios = {
        op: {
            label: round(us / per[base], 2) if us is not None and per[base] else None
            for label, us in per.items()
            if label != base
        }
        for op, per in medians.items()
    }
    per_message = p.get_many_capacity(client.transport.max_payload, KEY_BYTES)
    return {
        "keys": len(keys),
        "get_many_messages": -(-len(keys) // per_message),
        "max_payload_bytes": client.transport.max_payload,
        "rounds": rounds,
        "idle_ms": [_label(ms) for ms in idle_ms],
        "baseline_idle_ms": base,
        "median_us": medians,
        "over_baseline": ratios,
        "nowait_refused": refused,
    }
