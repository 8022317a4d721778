"""The connector's counters in vLLM's own metrics: the log line and Prometheus `/metrics`.

vLLM asks every connector for `get_kv_connector_stats()` once per engine step, on each worker (the
model runner) and on the scheduler; it sums the workers' objects (`aggregate`), adds the
scheduler's, ships `to_dict()` to the front end, rebuilds the object there with the connector
class's `build_kv_connector_stats(data)`, logs `reduce()` every few seconds, and hands the same data
to `build_prom_metrics(...).observe()` for `/metrics`.

What we report comes from the counters the connector keeps anyway (stats.py): each call takes what
was added since the previous one. Counters become Prometheus counters named
`vllm:beluga_<name>` (exposed with `_total`, as vLLM's NIXL connector names its own); each metadata
timing becomes an observation of a `vllm:beluga_<what>_seconds` histogram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from vllm_beluga.stats import ConnectorStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Counter name in the vLLM stats (and Prometheus, after `vllm:beluga_`) -> help text. Their values
# are the connector's counters of the same name (stats.py), except where COUNTER_SOURCES says.
COUNTERS: dict[str, str] = {
    "hit_requests": "Requests that found leading blocks in the Beluga pool (scheduler lookups with a hit).",
    "hit_blocks": "Blocks offered to vLLM from the Beluga pool instead of being computed.",
    "lookup_requests": "Prefix lookups the scheduler sent to the Beluga metadata server.",
    "lookup_blocks": "Block keys those lookups asked about.",
    "loaded_blocks": "Blocks copied from the Beluga pool into the KV cache (summed over tensor-parallel ranks).",
    "loaded_bytes": "Bytes copied from the Beluga pool into the KV cache (summed over ranks).",
    "load_errors": "Blocks that could not be loaded from the pool and were recomputed.",
    "saved_blocks": "Blocks saved into the Beluga pool and committed (summed over ranks).",
    "saved_bytes": "Bytes saved into the Beluga pool and committed (summed over ranks).",
    "save_requests": "Save bursts (one per request and step with new full prompt blocks, per rank).",
    "save_skipped": "Blocks not saved: present already, pool full, fenced or the server away.",
    "metadata_unavailable": "Times the Beluga metadata server could not be reached (served without the pool).",
    "lookup_round_trips": "Metadata round trips of the scheduler (lookups, block locations, removal polls).",
    "load_metadata_round_trips": "Metadata round trips of workers' own block lookups for loads.",
    "save_metadata_round_trips": "Metadata round trips of saves (reserve and commit bursts).",
}
COUNTER_SOURCES = {"lookup_requests": "lookups", "metadata_unavailable": "server_unavailable"}
SKIP_PREFIX = "save_skipped_"  # save_skipped_exists, _poolfull, _fenced, ...: summed into save_skipped

# Histogram name -> (the connector's timing counter, help text). One observation per addition.
TIMINGS: dict[str, tuple[str, str]] = {
    "lookup": ("lookup_us", "Scheduler prefix-lookup latency against the Beluga metadata server."),
    "load_metadata": ("load_metadata_us", "Latency of a worker's block-location burst before a load."),
    "save_metadata": ("save_metadata_us", "Metadata latency of one save (reserve and commit bursts)."),
}
# 10 us .. 1 s: CXL-RPC round trips are microseconds, TCP ones tens of microseconds, an outage a timeout.
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1, 1.0)


def _empty() -> dict[str, Any]:
    return {"counters": dict.fromkeys(COUNTERS, 0), "latency_us": {name: [] for name in TIMINGS}}


@dataclass
class BelugaKVConnectorStats(KVConnectorStats):
    """One interval of the connector's activity. `data` (plain dicts and lists, so it crosses
    process boundaries): {"counters": {name: int}, "latency_us": {timing: [microseconds]}}."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()
            return
        # Data from another version of this class: keep what we know, fill the rest.
        data = _empty()
        for name, value in dict(self.data.get("counters") or {}).items():
            if name in data["counters"]:
                data["counters"][name] = int(value)
        for name, values in dict(self.data.get("latency_us") or {}).items():
            if name in data["latency_us"]:
                data["latency_us"][name] = [int(v) for v in values]
        self.data = data

    def reset(self) -> None:
        self.data = _empty()

    @classmethod
    def from_connector_stats(cls, stats: ConnectorStats, **extra: int) -> BelugaKVConnectorStats:
        """Take the interval's increments out of the connector's counters (and `extra` counters)."""
        added, observed = stats.take_interval()
        out = cls()
        counters = out.data["counters"]
        for name in COUNTERS:
            counters[name] = int(added.get(COUNTER_SOURCES.get(name, name), 0))
        counters["save_skipped"] = sum(v for k, v in added.items() if k.startswith(SKIP_PREFIX))
        for name, value in extra.items():
            counters[name] += int(value)
        for name, (source, _doc) in TIMINGS.items():
            out.data["latency_us"][name] = list(observed.get(source, ()))
        return out

    def is_empty(self) -> bool:
        return not any(self.data["counters"].values()) and not any(self.data["latency_us"].values())

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if other.is_empty():
            return self
        theirs = BelugaKVConnectorStats(data=other.data) if not isinstance(other, BelugaKVConnectorStats) else other
        for name, value in theirs.data["counters"].items():
            self.data["counters"][name] = self.data["counters"].get(name, 0) + value
        for name, values in theirs.data["latency_us"].items():
            self.data["latency_us"].setdefault(name, []).extend(values)
        return self

    def reduce(self) -> dict[str, int | float]:
        c = self.data["counters"]
        out: dict[str, int | float] = {
            "Hit requests": c["hit_requests"],
            "Hit blocks": c["hit_blocks"],
            "Loaded MiB": round(c["loaded_bytes"] / 2**20, 3),
            "Saved MiB": round(c["saved_bytes"] / 2**20, 3),
            "Load errors": c["load_errors"],
            "Saves skipped": c["save_skipped"],
            "Metadata round trips": c["lookup_round_trips"]
            + c["load_metadata_round_trips"]
            + c["save_metadata_round_trips"],
        }
        for name, values in self.data["latency_us"].items():
            if values:
                out[f"Avg {name.replace('_', ' ')} (us)"] = round(sum(values) / len(values), 1)
        return out


class BelugaPromMetrics(KVConnectorPromMetrics):
    """`vllm:beluga_*` counters and latency histograms, one child per engine (vLLM's labels)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine

        self.counters = {
            name: create_metric_per_engine(
                self._counter_cls(name=f"vllm:beluga_{name}", documentation=doc, labelnames=labelnames),
                per_engine_labelvalues,
            )
            for name, doc in COUNTERS.items()
        }
        self.histograms = {
            name: create_metric_per_engine(
                self._histogram_cls(
                    name=f"vllm:beluga_{name}_seconds",
                    documentation=doc,
                    buckets=list(LATENCY_BUCKETS),
                    labelnames=labelnames,
                ),
                per_engine_labelvalues,
            )
            for name, (_source, doc) in TIMINGS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        stats = BelugaKVConnectorStats(data=dict(transfer_stats_data))
        for name, value in stats.data["counters"].items():
            if value > 0 and name in self.counters:
                self.counters[name][engine_idx].inc(value)
        for name, values in stats.data["latency_us"].items():
            if name in self.histograms:
                for us in values:
                    self.histograms[name][engine_idx].observe(us / 1e6)
