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


# Piped or redirected output (| less, > file, a CI log) has no width to fit: rich would assume 80
# columns and cut cells (`0x1000000…`). Tables then take their natural width instead, up to this.
PIPED_WIDTH = 1000


def output_width(stream: Any = None) -> int | None:
    """The width to render for: None on a terminal (rich asks it), $COLUMNS if set, else PIPED_WIDTH."""
    import os

    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


def stdout_console(*, markup: bool = True):  # -> rich.console.Console, imported lazily to keep --help fast
    from rich.console import Console
    from rich.table import Table

    class FoldingConsole(Console):
        """A table too wide for the terminal folds its cells onto more lines: identifiers, addresses
        and numbers are never cut to `0x1000000…`."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            for obj in objects:
                if isinstance(obj, Table):
                    for column in obj.columns:
                        if column.overflow == "ellipsis":
                            column.overflow = "fold"
            super().print(*objects, **kwargs)

    # emoji off: PCI addresses such as 0000:ab:00.0 must not become pictures
    return FoldingConsole(highlight=False, emoji=False, markup=markup, width=output_width())


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False, width=output_width(sys.stderr))
