"""Metric names in the shipped Grafana dashboard, and the names each exporter really has (for the tests)."""

from __future__ import annotations

import json
import re
import types
from importlib.resources import files
from pathlib import Path
from typing import Any

OPS = Path(__file__).resolve().parents[1] / "ops"  # where the recorded name lists live
# Metric-like words the dashboard may use that no exporter of ours defines.
PROMETHEUS_BUILTINS = {"up"}
_PREFIXES = ("beluga_", "vllm:", "haproxy_")
_FUNCTIONS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "label_values",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
}  # fmt: skip


def dashboard() -> dict[str, Any]:
    return json.loads(files("belugactl").joinpath("data/grafana/belugactl.json").read_text())


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every panel target and every query variable."""
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out.append((f"variable {var['name']}", query["query"] if isinstance(query, dict) else query))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: label matchers, strings and durations removed first."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range durations, $__rate_interval
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping label lists
    text = re.sub(r"\blabel_values\(([^,()]*),[^)]*\)", r"\1", text)  # Grafana's label_values(metric, label)
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
    return {w for w in words if w not in _FUNCTIONS and not re.fullmatch(r"[0-9.e]+", w)}


def label_values(expr: str, label: str) -> set[str]:
    """Literal values an expression matches a label against (`label="x"` or `label=~"x|y"`)."""
    out: set[str] = set()
    for op, value in re.findall(rf'\b{label}\s*(=~|=)\s*"([^"]*)"', expr):
        out.update(value.split("|") if op == "=~" else [value])
    return out


def metadata_server_names() -> tuple[set[str], dict[str, set[str]]]:
    """Sample names (and label values) the metadata server's /metrics collector yields, from the code.

    The collector is fed a snapshot with every counter non-zero and a latency histogram per opcode,
    so families that only appear once something happened are present too.
    """
    from belugactl.dataplane.mds.admin import _Collector
    from belugactl.dataplane.rpc.protocol import Code, Op

    snapshot = {
        "epoch": 3,
        "ready": True,
        "index": {
            "bytes_used": 1, "bytes_free": 1, "bytes_reserved": 1, "bytes_capacity": 2, "entries": 1,
            "reservations": 1, "leases": 1, "namespaces": 1, "evictions": 1, "evicted_bytes": 1,
            "reservations_reclaimed": 1, "pool_full": 1,
        },
        "requests": {
            "bad_slots": 1, "cxl": 1, "tcp": 1,
            "by_op": {op.name: 1 for op in Op},
            "errors_by_code": {code.name: 1 for code in Code if code.name != "OK"},
        },
        "latency": {op.name: {"count": 1, "sum": 0.001, "buckets": [0.001, 0.01], "counts": [1, 0]} for op in Op},
    }  # fmt: skip
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for family in _Collector(types.SimpleNamespace(snapshot=snapshot)).collect():  # type: ignore[arg-type]
        for sample in family.samples:
            names.add(sample.name)
            for key, value in sample.labels.items():
                labels.setdefault(key, set()).add(value)
    return names, labels


def recorded_names(file: str) -> set[str]:
    lines = (OPS / file).read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}
