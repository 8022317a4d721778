"""What the connector's own counters say about one timed request: its metadata time, its copy time,
and where a pool hit's time goes beside the local prefix-cache hit.

The connector (plugins/vllm_beluga stats.py) keeps cumulative counters per role in
`<stats prefix>.<role>.json` (`scheduler`, `worker<rank>`), rewritten about 0.25 s after they
changed. The bench reads them at quiet points (after the settle before each timed request), so the
difference between two readings is what the one request in between cost.

Metadata time is every microsecond counter named for a metadata operation (lookup, locate, release,
reserve, commit, or `metadata` in its name: `lookup_us`, `load_metadata_us`, `save_metadata_us`
today); the copy is `load_us` (worker: the copy, its checksum and the lease release). Counters the
connector gains later under such names are picked up without a change here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from belugactl.workflows.serve.connector_report import read_connector_stats

Counters = dict[str, dict[str, int]]  # role -> counter -> value

METADATA_WORDS = ("lookup", "locate", "release", "reserve", "commit", "metadata")
# Copy time per role and the metadata that counter is known to include (subtracted to avoid
# counting it twice). load_us also covers the lease release, which has no counter of its own.
COPY_KEYS = ("load_us",)
# With layer-wise loads the copy overlaps the forward pass; what the forward waited for it is on the
# critical path (`layer_wait_us`, worker), where the connector reports it.
WAIT_KEYS = ("layer_wait_us",)
# Stats a hit's breakdown would need that the connector does not keep: none today (the scheduler's
# `lookup_us` covers locating the blocks too, one GET_MANY burst; the worker reports `load_release_us`).
# A later split that wants a new counter names it here, and the report lists it until it appears.
WANTED_STATS: dict[str, str] = {}


def read_counters(prefix: str | None) -> Counters:
    """Every role's counters under `prefix` (nothing when there is no prefix or no file yet)."""
    if not prefix:
        return {}
    out: Counters = {}
    for role, doc in read_connector_stats(prefix).items():
        counters = doc.get("counters")
        if isinstance(counters, dict):
            out[role] = {k: v for k, v in counters.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out


def delta(before: Counters, after: Counters) -> Counters:
    """after - before, per role and counter, keeping only what changed."""
    out: Counters = {}
    for role, counters in after.items():
        prior = before.get(role, {})
        changed = {k: v - prior.get(k, 0) for k, v in counters.items() if v != prior.get(k, 0)}
        if changed:
            out[role] = changed
    return out


def is_metadata_us(name: str) -> bool:
    return name.endswith("_us") and any(word in name for word in METADATA_WORDS)


def metadata_of(change: Counters) -> dict[str, Any]:
    """Metadata microseconds and round trips in one request's counter change, by `role.counter`."""
    by_key = {
        f"{role}.{name}": value
        for role, counters in sorted(change.items())
        for name, value in sorted(counters.items())
        if is_metadata_us(name)
    }
    trips = {
        f"{role}.{name}": value
        for role, counters in sorted(change.items())
        for name, value in sorted(counters.items())
        if name.endswith("_round_trips")
    }
    return {"us": sum(by_key.values()), "by_key": by_key, "round_trips": sum(trips.values()), "trips_by_key": trips}


def copy_us(change: Counters) -> int:
    return sum(v for counters in change.values() for k, v in counters.items() if k in COPY_KEYS)


def wait_us(change: Counters) -> int:
    return sum(v for counters in change.values() for k, v in counters.items() if k in WAIT_KEYS)


def saves_done(counters: Counters) -> int:
    """Saves finished (committed or skipped), over every role: `save_requests` counts each at its end,
    also when the connector saves asynchronously, after the request was answered."""
    return sum(c.get("save_requests", 0) for c in counters.values())


def summarize_hits(changes: Sequence[Counters], ttft_pool_hit_s: float | None) -> dict[str, Any]:
    """Per pool-hit request: metadata microseconds (median over the rounds) and their share of the
    pool-hit TTFT (target < 1 %)."""
    metas = [metadata_of(c) for c in changes]
    per_request = [m["us"] for m in metas]
    median_us = statistics.median(per_request) if per_request else None
    keys = sorted({k for m in metas for k in m["by_key"]})
    share = None
    if median_us is not None and ttft_pool_hit_s:
        share = 100.0 * median_us / (ttft_pool_hit_s * 1e6)
    return {
        "per_request_us": per_request,
        "median_us": median_us,
        "by_key_median_us": {k: statistics.median([m["by_key"].get(k, 0) for m in metas]) for k in keys},
        "round_trips": [m["round_trips"] for m in metas],
        "share_of_pool_hit_pct": share,
        "target_pct": 1.0,
        "met": None if share is None else share < 1.0,
        "reported": bool(keys),
    }


def summarize_saves(changes: Sequence[Counters]) -> dict[str, Any]:
    """The writer's side: metadata microseconds per compute-and-save request (A)."""
    metas = [metadata_of(c) for c in changes]
    per_request = [m["us"] for m in metas]
    return {
        "per_request_us": per_request,
        "median_us": statistics.median(per_request) if per_request else None,
        "round_trips": [m["round_trips"] for m in metas],
    }


def breakdown(
    ttft_pool_hit_s: float | None, ttft_local_hit_s: float | None, changes: Sequence[Counters]
) -> dict[str, Any] | None:
    """Where the pool hit's time beyond the local hit goes, from the medians: metadata (scheduler
    lookup, locate), the copy, and what no counter covers (the engine step with a connector,
    scheduling, HTTP). Needs both TTFTs; counters are medians over the hit requests. Where the
    connector loads layer by layer (it reports `layer_wait_us`), only the forward's wait for the
    copy is on the critical path; else the whole copy is."""
    if ttft_pool_hit_s is None or ttft_local_hit_s is None:
        return None
    extra_ms = (ttft_pool_hit_s - ttft_local_hit_s) * 1e3
    metas = [metadata_of(c) for c in changes]
    metadata_ms = statistics.median([m["us"] for m in metas]) / 1e3 if metas else 0.0
    copy_ms = statistics.median([copy_us(c) for c in changes]) / 1e3 if changes else 0.0
    seen = {name for c in changes for counters in c.values() for name in counters}
    layerwise = any(k in seen for k in WAIT_KEYS)
    wait_ms = statistics.median([wait_us(c) for c in changes]) / 1e3 if layerwise else None
    critical_ms = wait_ms if wait_ms is not None else copy_ms
    return {
        "pool_hit_ms": ttft_pool_hit_s * 1e3,
        "local_hit_ms": ttft_local_hit_s * 1e3,
        "beyond_floor_ms": extra_ms,
        "metadata_ms": metadata_ms,
        "copy_ms": copy_ms,
        "copy_wait_ms": wait_ms,
        "unattributed_ms": extra_ms - metadata_ms - critical_ms,
        "missing_stats": {k: why for k, why in WANTED_STATS.items() if k not in seen},
    }


def format_us_keys(by_key: Mapping[str, float], limit: int = 4) -> str:
    parts = [f"{k} {v:.0f}" for k, v in sorted(by_key.items(), key=lambda kv: -kv[1]) if v][:limit]
    return ", ".join(parts) if parts else "none"


def roles_reporting(changes: Iterable[Counters]) -> list[str]:
    return sorted({role for c in changes for role in c})
