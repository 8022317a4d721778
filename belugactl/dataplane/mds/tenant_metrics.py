"""Per-tenant metrics for /metrics (label `tenant`), from the admin snapshot's index.tenants.

The label's values come from the manifest's tenants (plus `_implicit`, what no tenant owns), never
from what a client sends, so the label's cardinality is bounded by the manifest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_GAUGES = (
    ("beluga_mds_tenant_live_leases", "Read leases a tenant's clients hold", "live_leases"),
    ("beluga_mds_tenant_reserved_bytes", "Bytes a tenant's pending reservations hold", "reserved_bytes"),
    ("beluga_mds_tenant_stored_bytes", "Bytes of a tenant's committed blocks", "stored_bytes"),
    ("beluga_mds_tenant_connections", "TCP connections of a tenant", "connections"),
    ("beluga_mds_tenant_namespaces", "Namespaces a tenant holds", "namespaces"),
    ("beluga_mds_tenant_entries", "Committed blocks of a tenant", "entries"),
)
_COUNTERS = (
    ("beluga_mds_tenant_evictions", "A tenant's blocks evicted (fair eviction, or its stored quota)", "evictions"),
    ("beluga_mds_tenant_evicted_bytes", "Bytes of a tenant's blocks evicted", "evicted_bytes"),
)


def tenant_metrics(snap: dict[str, Any]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    tenants: dict[str, dict[str, Any]] = snap.get("index", {}).get("tenants", {})
    if not tenants:
        return
    for name, help_, key in _GAUGES:
        g = GaugeMetricFamily(name, help_, labels=["tenant"])
        for tenant, t in tenants.items():
            g.add_metric([tenant], t.get(key, 0))
        yield g
    for name, help_, key in _COUNTERS:
        c = CounterMetricFamily(name, help_, labels=["tenant"])
        for tenant, t in tenants.items():
            c.add_metric([tenant], t.get(key, 0))
        yield c
    refused = CounterMetricFamily(
        "beluga_mds_tenant_refused", "Requests refused for a tenant's quota, by what", labels=["tenant", "quota"]
    )
    for tenant, t in tenants.items():
        for what, n in t.get("refused", {}).items():
            refused.add_metric([tenant, what], n)
    yield refused
    weight = GaugeMetricFamily("beluga_mds_tenant_weight", "A tenant's fair-share weight", labels=["tenant"])
    for tenant, t in tenants.items():
        weight.add_metric([tenant], t.get("weight", 1))
    yield weight
