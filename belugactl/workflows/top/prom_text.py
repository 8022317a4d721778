"""Prometheus text exposition (what /metrics answers), parsed into samples a view can sum."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Labels = dict[str, str]


class NotPrometheusText(ValueError):
    """The answer was not Prometheus text exposition."""


@dataclass(frozen=True)
class Metrics:
    """One scrape's samples by sample name (`beluga_mds_hits_total`, `..._bucket`)."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str, **match: str) -> float | None:
        """The sum of `name`'s samples whose labels include `match`; None when none is exposed."""
        found = [v for labels, v in self.samples.get(name, ()) if _matches(labels, match)]
        return math.fsum(found) if found else None

    def label_values(self, name: str, label: str, **match: str) -> dict[str, float]:
        """`label`'s value -> the sum of the samples carrying it (e.g. each server's status)."""
        out: dict[str, float] = {}
        for labels, v in self.samples.get(name, ()):
            if label in labels and _matches(labels, match):
                out[labels[label]] = out.get(labels[label], 0.0) + v
        return out

    def buckets(self, histogram: str, **match: str) -> list[tuple[float, float]]:
        """A histogram's cumulative buckets (upper bound, count), summed over its other labels."""
        by_bound: dict[float, float] = {}
        for labels, v in self.samples.get(f"{histogram}_bucket", ()):
            if "le" in labels and _matches(labels, match):
                bound = float(labels["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + v
        return sorted(by_bound.items())


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def parse(text: str) -> Metrics:
    """Parse exposition text; NotPrometheusText when it is not (an HTML page, a JSON error)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[tuple[Labels, float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise NotPrometheusText(f"not Prometheus text ({exc})") from None
    return Metrics(samples)
