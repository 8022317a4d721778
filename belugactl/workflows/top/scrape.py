"""Scrape the rack's metrics endpoints: the list `export prometheus` writes, fetched over HTTP.

`top` reads what Prometheus reads and nothing else (no run dir, no state files), so it works from
any machine that can reach the endpoints, and what it shows agrees with the dashboard.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from belugactl.workflows.top.prom_text import Metrics, NotPrometheusText, parse

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Manifest
    from belugactl.workflows.export_prometheus import Target

# A /metrics answer larger than this is not one of ours (vLLM's is ~100 KiB): stop reading.
MAX_BODY = 16 * 1024 * 1024
MAX_PARALLEL = 32  # 16 hosts x (instances + router) + the metadata server, in one wave
# Straight to the endpoint, as Prometheus goes: an http_proxy meant for the internet must not answer
# for the rack's own listeners.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Scrape:
    """One endpoint's answer: its metrics, or why there are none."""

    target: Target
    metrics: Metrics | None
    error: str | None = None
    seconds: float = 0.0  # how long the scrape took

    @property
    def ok(self) -> bool:
        return self.metrics is not None


@dataclass(frozen=True)
class Round:
    """Every endpoint scraped once, at `at` (time.monotonic()) and `wall` (time.time())."""

    at: float
    wall: float
    scrapes: dict[str, Scrape] = field(default_factory=dict)  # by Target.name

    def get(self, name: str) -> Scrape | None:
        return self.scrapes.get(name)


def targets(manifest: Manifest) -> tuple[list[Target], list[str]]:
    """The endpoints of the rack and the export's reachability warnings (a loopback listener elsewhere)."""
    from belugactl.workflows.export_prometheus import scrape_targets

    return scrape_targets(manifest)


def fetch(target: Target, timeout_s: float) -> Scrape:
    """GET http://<target>/metrics; never raises: a failure is a Scrape with its reason."""
    start = time.monotonic()
    try:
        with _OPENER.open(f"http://{target.address}/metrics", timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return Scrape(target, None, f"answer larger than {MAX_BODY // (1024 * 1024)} MiB", _since(start))
        return Scrape(target, parse(body.decode("utf-8", "replace")), None, _since(start))
    except NotPrometheusText as exc:
        return Scrape(target, None, str(exc)[:120], _since(start))
    except urllib.error.HTTPError as exc:
        return Scrape(target, None, f"HTTP {exc.code} on /metrics", _since(start))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Scrape(target, None, reason(exc, timeout_s), _since(start))


def reason(exc: BaseException, timeout_s: float) -> str:
    """A short why for a failed connection: refused, no answer, unknown host, or the OS's words."""
    inner = getattr(exc, "reason", exc)
    if isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    if isinstance(inner, TimeoutError | socket.timeout):
        return f"no answer in {timeout_s:g}s"
    if isinstance(inner, socket.gaierror):
        return "unknown host name"
    if isinstance(inner, ConnectionResetError):
        return "connection reset"
    text = getattr(inner, "strerror", None) or str(inner)
    return text.lower()[:120] or type(inner).__name__


def _since(start: float) -> float:
    return time.monotonic() - start


def scrape_round(endpoints: list[Target], timeout_s: float) -> Round:
    """Every endpoint at once (threads): a round costs the slowest endpoint, at most `timeout_s`."""
    at, wall = time.monotonic(), time.time()
    if not endpoints:
        return Round(at, wall)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(endpoints)), thread_name_prefix="top-scrape") as pool:
        results = list(pool.map(lambda t: fetch(t, timeout_s), endpoints))
    return Round(at, wall, {s.target.name: s for s in results})
