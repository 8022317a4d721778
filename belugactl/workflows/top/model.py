"""From two successive rounds of scrapes to what the view shows: health, pool use, hit rate,
bytes per second, latency, evictions, the front door's backends.

Rates and hit rates are over the interval between the two rounds (a counter that went down was
reset by a restart: its new value is the increase, Prometheus's rule). With one round only, they are
None ("-" on screen); gauges (pool bytes, entries, requests running) need one round.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.workflows.top.prom_text import Metrics

if TYPE_CHECKING:
    from belugactl.workflows.export_prometheus import Target
    from belugactl.workflows.top.scrape import Round, Scrape

ROUTER_BACKEND = "vllm"  # the HAProxy backend serve writes (workflows/serve/router.py: BACKEND)
# HAProxy's server states, the worst first: an instance's column shows the worst its routers report.
ROUTER_STATES = ("DOWN", "MAINT", "DRAIN", "NOLB", "UP")


@dataclass(frozen=True)
class MetadataView:
    host: str
    address: str
    state: str  # up | not ready | down
    error: str | None = None
    epoch: int | None = None
    restarted: bool = False  # the epoch changed since the previous round
    used_bytes: float | None = None
    capacity_bytes: float | None = None
    entries: int | None = None
    leases: int | None = None
    hit_rate: float | None = None  # hits / (hits + misses) of lookups and GETs in the interval
    lookups_per_s: float | None = None
    loaded_bytes_per_s: float | None = None  # bytes leased to readers
    saved_bytes_per_s: float | None = None  # bytes committed
    requests_per_s: float | None = None
    p50_s: float | None = None  # service time of the interval's requests, every op
    p99_s: float | None = None
    evictions: int | None = None
    evictions_per_s: float | None = None


@dataclass(frozen=True)
class RouterView:
    host: str
    address: str
    state: str  # up | down
    error: str | None = None
    backends: dict[str, str] = field(default_factory=dict)  # instance name -> UP, DOWN, MAINT, ...
    sessions: dict[str, int] = field(default_factory=dict)  # instance name -> current sessions
    # haproxy, or pd-proxy (prefill/decode racks: belugactl's own front door, which keeps no backend list)
    kind: str = "haproxy"
    requests: int | None = None  # pd-proxy: requests it has relayed

    @property
    def backends_up(self) -> int:
        return sum(1 for s in self.backends.values() if s == "UP")


@dataclass(frozen=True)
class InstanceView:
    host: str
    name: str  # <host>-vllm-<i>
    address: str
    state: str  # up | down
    error: str | None = None
    hit_rate: float | None = None  # external prefix cache (pool) hits / queries, tokens, in the interval
    loaded_bytes_per_s: float | None = None
    saved_bytes_per_s: float | None = None
    lookup_s: float | None = None  # mean scheduler lookup latency in the interval
    running: int | None = None
    waiting: int | None = None
    metadata_unavailable_per_s: float | None = None
    router: str | None = None  # the front door's view: UP, DOWN, ...; "?" no router answered; None: no router

    @property
    def short(self) -> str:
        """The name without its host: `vllm-0`."""
        return self.name.removeprefix(f"{self.host}-")


@dataclass(frozen=True)
class HostView:
    name: str
    state: str  # up | partial | down | - (no instance)
    up: int
    total: int


@dataclass(frozen=True)
class Snapshot:
    rack: str
    wall: float  # time.time() of the newest round
    interval_s: float | None  # between the two rounds the rates come from
    metadata: MetadataView | None
    routers: list[RouterView]
    instances: list[InstanceView]
    hosts: list[HostView]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        for router, view in zip(doc["routers"], self.routers, strict=True):
            router["backends_up"] = view.backends_up
        return doc


def counter_delta(prev: Metrics | None, cur: Metrics, name: str, **match: str) -> float | None:
    """The counter's increase between two scrapes (a decrease means it was reset: the new value)."""
    if prev is None:
        return None
    a, b = prev.total(name, **match), cur.total(name, **match)
    if a is None or b is None:
        return None
    return b - a if b >= a else b


def rate(prev: Metrics | None, cur: Metrics, dt: float | None, name: str, **match: str) -> float | None:
    delta = counter_delta(prev, cur, name, **match)
    if delta is None or dt is None or dt <= 0:
        return None
    return delta / dt


def ratio(hits: float | None, total: float | None) -> float | None:
    if hits is None or total is None or total <= 0:
        return None
    return min(1.0, hits / total)


def bucket_delta(prev: Metrics | None, cur: Metrics, histogram: str) -> list[tuple[float, float]]:
    """The histogram's buckets for the interval (its cumulative buckets now minus then)."""
    now = cur.buckets(histogram)
    if prev is None:
        return []
    before = dict(prev.buckets(histogram))
    out = [(bound, count - before.get(bound, 0.0)) for bound, count in now]
    if any(count < 0 for _, count in out):  # reset by a restart: everything counted is new
        return now
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket; the +Inf bucket answers its lower bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def metadata_view(target: Target, prev: Scrape | None, cur: Scrape, dt: float | None) -> MetadataView:
    if cur.metrics is None:
        return MetadataView(target.host, target.address, "down", cur.error)
    m = cur.metrics
    p = prev.metrics if prev is not None else None
    epoch = _int(m.total("beluga_mds_epoch"))
    restarted = p is not None and epoch is not None and _int(p.total("beluga_mds_epoch")) not in (None, epoch)
    if restarted:
        p = None  # a new incarnation: its counters started over, and the interval's rates are unknown
    hits = counter_delta(p, m, "beluga_mds_hits_total")
    misses = counter_delta(p, m, "beluga_mds_misses_total")
    lookups = None if hits is None or misses is None else hits + misses
    latency = bucket_delta(p, m, "beluga_mds_request_seconds")
    return MetadataView(
        host=target.host,
        address=target.address,
        state="up" if m.total("beluga_mds_ready") == 1 else "not ready",
        epoch=epoch,
        restarted=restarted,
        used_bytes=m.total("beluga_mds_pool_bytes", state="used"),
        capacity_bytes=m.total("beluga_mds_pool_bytes", state="capacity"),
        entries=_int(m.total("beluga_mds_entries")),
        leases=_int(m.total("beluga_mds_leases")),
        hit_rate=ratio(hits, lookups),
        lookups_per_s=None if lookups is None or not dt else lookups / dt,
        loaded_bytes_per_s=rate(p, m, dt, "beluga_mds_leased_bytes_total"),
        saved_bytes_per_s=rate(p, m, dt, "beluga_mds_saved_bytes_total"),
        requests_per_s=rate(p, m, dt, "beluga_mds_requests_total"),
        p50_s=quantile(0.5, latency),
        p99_s=quantile(0.99, latency),
        evictions=_int(m.total("beluga_mds_evictions_total")),
        evictions_per_s=rate(p, m, dt, "beluga_mds_evictions_total"),
    )


def router_view(target: Target, cur: Scrape) -> RouterView:
    if cur.metrics is None:
        return RouterView(target.host, target.address, "down", cur.error)
    m = cur.metrics
    if not m.has("haproxy_server_status") and m.has("beluga_pd_requests_total"):
        return RouterView(
            target.host, target.address, "up", kind="pd-proxy", requests=_int(m.total("beluga_pd_requests_total"))
        )
    backends: dict[str, str] = {}
    for labels, value in m.samples.get("haproxy_server_status", ()):
        if labels.get("proxy") == ROUTER_BACKEND and value == 1 and "server" in labels:
            backends[labels["server"]] = labels.get("state", "?")
    current = m.label_values("haproxy_server_current_sessions", "server", proxy=ROUTER_BACKEND)
    sessions = {k: int(v) for k, v in current.items()}
    return RouterView(target.host, target.address, "up", None, backends, sessions)


def instance_view(target: Target, prev: Scrape | None, cur: Scrape, dt: float | None) -> InstanceView:
    if cur.metrics is None:
        return InstanceView(target.host, target.name, target.address, "down", cur.error)
    m = cur.metrics
    p = prev.metrics if prev is not None else None
    lookups = counter_delta(p, m, "vllm:beluga_lookup_seconds_count")
    lookup_time = counter_delta(p, m, "vllm:beluga_lookup_seconds_sum")
    return InstanceView(
        host=target.host,
        name=target.name,
        address=target.address,
        state="up",
        hit_rate=ratio(
            counter_delta(p, m, "vllm:external_prefix_cache_hits_total"),
            counter_delta(p, m, "vllm:external_prefix_cache_queries_total"),
        ),
        loaded_bytes_per_s=rate(p, m, dt, "vllm:beluga_loaded_bytes_total"),
        saved_bytes_per_s=rate(p, m, dt, "vllm:beluga_saved_bytes_total"),
        lookup_s=lookup_time / lookups if lookups and lookup_time is not None else None,
        running=_int(m.total("vllm:num_requests_running")),
        waiting=_int(m.total("vllm:num_requests_waiting")),
        metadata_unavailable_per_s=rate(p, m, dt, "vllm:beluga_metadata_unavailable_total"),
    )


def _router_state(name: str, routers: list[RouterView]) -> str | None:
    routers = [r for r in routers if r.kind == "haproxy"]
    if not routers:
        return None
    seen = [r.backends[name] for r in routers if r.state == "up" and name in r.backends]
    if not seen:
        return "?"
    return min(seen, key=lambda s: ROUTER_STATES.index(s) if s in ROUTER_STATES else 0)


def build_snapshot(
    rack: str, hosts: list[str], endpoints: list[Target], prev: Round | None, cur: Round, notes: list[str] | None = None
) -> Snapshot:
    """What the view shows, from the newest round and (for rates) the one before it."""
    from dataclasses import replace

    dt = cur.at - prev.at if prev is not None else None
    metadata: MetadataView | None = None
    routers: list[RouterView] = []
    instances: list[InstanceView] = []
    for target in endpoints:
        scrape = cur.get(target.name)
        if scrape is None:
            continue
        before = prev.get(target.name) if prev is not None else None
        if target.job == "beluga-metadata":
            metadata = metadata_view(target, before, scrape, dt)
        elif target.job == "beluga-router":
            routers.append(router_view(target, scrape))
        elif target.job == "beluga-vllm":
            instances.append(instance_view(target, before, scrape, dt))
    instances = [replace(i, router=_router_state(i.name, routers)) for i in instances]
    host_views = []
    for name in hosts:
        mine = [i for i in instances if i.host == name]
        up = sum(1 for i in mine if i.state == "up")
        state = "-" if not mine else "up" if up == len(mine) else "down" if up == 0 else "partial"
        host_views.append(HostView(name, state, up, len(mine)))
    return Snapshot(rack, cur.wall, dt, metadata, routers, instances, host_views, list(notes or []))
