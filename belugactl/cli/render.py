"""Shared rendering helpers: errors, JSON documents, the console on stderr/stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

from belugactl.errors import BelugaError


def print_error(exc: BelugaError, *, as_json: bool = False) -> None:
    """What happened, why, and the fix, on stderr; never a traceback."""
    if as_json:
        print(json.dumps(exc.to_dict(), indent=2), file=sys.stderr)
        return
    lines = [f"error: {exc.what}"]
    if exc.where is not None and str(exc.where) not in exc.what:
        lines.append(f"  where: {exc.where}")
    if exc.why:
        why_lines = exc.why.splitlines()
        lines.append(f"  why: {why_lines[0]}")
        lines.extend(f"       {line}" for line in why_lines[1:])
    if exc.fix:
        lines.append(f"  fix: {exc.fix}")
    print("\n".join(lines), file=sys.stderr)


def print_json(document: Any) -> None:
    """Machine output: one JSON document on stdout, stable keys, nothing else on stdout."""
    json.dump(document, sys.stdout, indent=2, sort_keys=False, default=_default)
    sys.stdout.write("\n")


def _default(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    return str(obj)


def stdout_console():  # -> rich.console.Console, imported lazily to keep --help fast
    from rich.console import Console

    # emoji off: PCI addresses such as 0000:ab:00.0 must not become pictures
    return Console(highlight=False, emoji=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)
