"""Did each vLLM instance's connector reach the metadata server, and what has it done since?

The connector writes its own counters (plugins/vllm_beluga stats.py) to
`<run dir>/stats/<instance>.<role>.json`, one file per role: `scheduler` (lookups, over the
instance's CXL-RPC ring) and `worker<rank>` (saves and loads, over TCP). Each holds `healthy` (the
last call reached the server), `connects` and `server_unavailable` counts, and the hit, save and
load-error counters. The metadata server keeps no per-client numbers, so these files are the only
witness: where none reports a value it is shown as unknown (None), never as 0.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_connector_stats(prefix: str) -> dict[str, dict[str, Any]]:
    """Every role's stats document under `prefix` (missing or torn files are skipped)."""
    base = Path(prefix)
    out: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for path in sorted(base.parent.glob(base.name + ".*.json")):
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(path.read_text())
                if isinstance(doc, dict):
                    out[str(doc.get("role", path.name))] = doc
    return out


def _counter(doc: dict[str, Any], name: str) -> int:
    counters = doc.get("counters")
    value = counters.get(name) if isinstance(counters, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _role_connected(doc: dict[str, Any]) -> bool | None:
    """True: it reached the server and its last call did; False: its last attempt failed; None: not tried."""
    if doc.get("healthy") is False:
        return False
    if _counter(doc, "connects") > 0:
        return True
    return None


def summarize(roles: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One instance: connected (True/False/None), hits, saves, load errors (None where nothing reports)."""
    scheduler = roles.get("scheduler")
    workers = [doc for role, doc in roles.items() if role.startswith("worker")]
    states = {role: _role_connected(doc) for role, doc in roles.items()}
    # Saves and loads go through the workers: an instance whose scheduler looks up over its ring but whose
    # workers cannot reach the TCP listener never saves a block, so every role must have connected.
    if any(state is False for state in states.values()):
        connected: bool | None = False
    elif states and scheduler is not None and workers and all(state is True for state in states.values()):
        connected = True
    else:
        connected = None
    why = None
    if connected is False:
        failing = sorted(role for role, state in states.items() if state is False)
        why = f"{', '.join(failing)}: the last call to the metadata server failed"
    elif connected is None:
        missing = [r for r, present in (("scheduler", scheduler is not None), ("worker", bool(workers))) if not present]
        why = f"no report from its {' and '.join(missing)}" if missing else "has not contacted the server yet"
    return {
        "connected": connected,
        "why": why,
        "hits": _counter(scheduler, "hit_blocks") if scheduler is not None else None,
        "saves": sum(_counter(doc, "saved_blocks") for doc in workers) if workers else None,
        "load_errors": sum(_counter(doc, "load_errors") for doc in workers) if workers else None,
        "server_unavailable": sum(_counter(doc, "server_unavailable") for doc in roles.values()) if roles else None,
    }


def wait_for_connectors(
    instances: dict[str, str],
    *,
    timeout_s: float = 15.0,
    poll_s: float = 0.5,
    read: Callable[[str], dict[str, dict[str, Any]]] = read_connector_stats,
) -> dict[str, dict[str, Any]]:
    """Each instance's summary once every one has a definite answer, or at the timeout (then as it stands)."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = {name: summarize(read(prefix)) for name, prefix in instances.items()}
        if all(entry["connected"] is not None for entry in report.values()) or time.monotonic() >= deadline:
            return report
        time.sleep(poll_s)


def describe(entry: dict[str, Any]) -> str:
    """One status fragment, e.g. "connected, hits 12, saves 40, load errors 0"."""

    def show(value: Any) -> str:
        return "unknown" if value is None else str(value)

    state = {True: "connected", False: "NOT connected", None: "connection unknown"}[entry.get("connected")]
    text = f"{state}, hits {show(entry.get('hits'))}, saves {show(entry.get('saves'))}"
    return text + f", load errors {show(entry.get('load_errors'))}"
