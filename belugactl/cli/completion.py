"""Shell completion (Typer autocompletion) for host names, doctor check ids and setup topics.

Each completer is quiet: whatever goes wrong (no manifest yet, a broken one) completes nothing
rather than printing into the user's shell. `belugactl --install-completion` installs them.
"""

from __future__ import annotations

import os
from typing import Any

# Parameters that carry the manifest, by the names commands give them.
_MANIFEST_PARAMS = ("file", "manifest")


def setup_topic_ids() -> tuple[str, ...]:
    """Every setup topic id, in planning order: the one place the CLI reads them from."""
    from belugactl.workflows.setup.topics import topic_ids

    return tuple(topic_ids())


def check_ids() -> list[tuple[str, str]]:
    """(id, title) of every doctor check."""
    from belugactl.workflows.doctor import builtin_registry

    return [(c.id, c.title) for c in builtin_registry()]


def _manifest_file(ctx: Any) -> str | None:
    params = getattr(ctx, "params", None) or {}
    for name in _MANIFEST_PARAMS:
        value = params.get(name)
        if value:
            return str(value)
    return os.environ.get("BELUGA_MANIFEST")


def _last_item(incomplete: str) -> tuple[str, str]:
    """A comma list completes its last item: ("dax.x,cx", ...) -> ("dax.x,", "cx")."""
    head, _, last = incomplete.rpartition(",")
    return (head + "," if head else ""), last


def complete_host(ctx: Any, incomplete: str) -> list[str]:
    """Host names of the manifest given with -f (or $BELUGA_MANIFEST)."""
    file = _manifest_file(ctx)
    if not file:
        return []
    from belugactl.cli.load_rack import rack_context_quietly

    rack = rack_context_quietly(file)
    if rack is None:
        return []
    return [n for n in rack.manifest.host_names() if n.startswith(incomplete)]


def complete_check(incomplete: str) -> list[tuple[str, str]]:
    """Doctor check ids (and `all`), with their titles as help; comma lists complete their last item."""
    head, last = _last_item(incomplete)
    try:
        known = [*check_ids(), ("all", "every check")]
    except Exception:  # noqa: BLE001
        return []
    return [(head + cid, title) for cid, title in known if cid.startswith(last)]


def complete_topic(incomplete: str) -> list[str]:
    """Setup topic ids; `--only` takes a comma list, so the last item completes."""
    head, last = _last_item(incomplete)
    chosen = set(head.rstrip(",").split(",")) if head else set()
    return [head + t for t in setup_topic_ids() if t.startswith(last) and t not in chosen]
