"""What `top` watches, from the manifest: the endpoints, and two ways to look (once, or live)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from belugactl.workflows.top.model import Snapshot, build_snapshot
from belugactl.workflows.top.scrape import Round, scrape_round, targets

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Manifest
    from belugactl.workflows.export_prometheus import Target


@dataclass(frozen=True)
class TopSource:
    rack: str
    hosts: list[str]
    endpoints: list[Target]
    timeout_s: float
    notes: list[str] = field(default_factory=list)  # the export's warnings: loopback listeners elsewhere

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, timeout_s: float) -> TopSource:
        """InputError (exit 2) when the manifest serves nothing (no serve section)."""
        endpoints, warnings = targets(manifest)
        return cls(manifest.name, manifest.host_names(), endpoints, timeout_s, warnings)

    def scrape(self) -> Round:
        return scrape_round(self.endpoints, self.timeout_s)

    def build(self, previous: Round | None, current: Round) -> Snapshot:
        return build_snapshot(self.rack, self.hosts, self.endpoints, previous, current, self.notes)


def once(source: TopSource, interval_s: float) -> Snapshot:
    """Two rounds `interval_s` apart (the rates need both), as one snapshot."""
    first = source.scrape()
    time.sleep(max(interval_s - (time.monotonic() - first.at), 0.0))
    return source.build(first, source.scrape())
