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


# The version of every JSON document the CLI prints (docs/json.md): raised when a key is renamed
# or removed or its meaning changes; adding a key keeps it.
SCHEMA_VERSION = 1

# Whether this command line has printed a JSON document yet (`belugactl.cli.app.run` resets it):
# an error after the document must not add a second one to stdout.
_json_printed = False


def print_json(document: Any) -> None:
    """Machine output: one JSON document on stdout, stable keys, nothing else on stdout.

    A dict document gets `schema_version` as its first key (unless it carries its own)."""
    global _json_printed
    if isinstance(document, dict) and "schema_version" not in document:
        document = {"schema_version": SCHEMA_VERSION, **document}
    json.dump(document, sys.stdout, indent=2, sort_keys=False, default=_default)
    sys.stdout.write("\n")
    sys.stdout.flush()
    _json_printed = True


def json_printed() -> bool:
    return _json_printed


def reset_json_printed() -> None:
    global _json_printed
    _json_printed = False


def error_document(
    code: int, kind: str, message: str, *, hint: str | None = None, why: str | None = None, where: str | None = None
) -> dict[str, Any]:
    """`--json`'s answer when a command fails before its own document: {"ok": false, "error": {...}}."""
    error = {"code": code, "kind": kind, "message": message, "hint": hint, "why": why, "where": where}
    return {"schema_version": SCHEMA_VERSION, "ok": False, "error": error}


def error_document_for(exc: BelugaError) -> dict[str, Any]:
    doc = error_document(
        int(exc.exit_code),
        type(exc).__name__,
        exc.what,
        hint=exc.fix,
        why=exc.why,
        where=str(exc.where) if exc.where is not None else None,
    )
    problems = exc.to_dict().get("problems")
    if problems is not None:  # a manifest's problems, with the keys `manifest check --json` always had
        doc["file"] = getattr(exc, "file", None)
        doc["problems"] = problems
    return doc


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


def text_width(stream: Any = None) -> int:
    """The width prose (doctor's reasons and fixes) wraps at: the terminal's, $COLUMNS, else 80.
    Unlike a table, prose has no natural width to keep when piped."""
    width = output_width(stream)
    if width is None:
        import shutil

        return shutil.get_terminal_size().columns
    return 80 if width == PIPED_WIDTH else width


def wrap_hanging(text: str, width: int, *, first: int, indent: int) -> list[str]:
    """`text` wrapped to `width`, its first line starting at column `first`, the others at `indent`.
    Words are never split (a path or a PCI address stays whole, even past the width)."""
    import textwrap

    lines = textwrap.wrap(text, width=max(width - first, 20), break_long_words=False, break_on_hyphens=False)
    if not lines:
        return [""]
    head, rest = lines[0], " ".join(lines[1:])
    tail = textwrap.wrap(rest, width=max(width - indent, 20), break_long_words=False, break_on_hyphens=False)
    return [head, *[" " * indent + line for line in tail]]


def shell_lines(command: str, width: int, *, indent: int) -> list[str]:
    """One shell command in lines of at most `width` (where it has spaces outside quotes to break at),
    continued with ` \\`; pasted into a shell, the lines run as the one command."""
    pad = " " * indent
    if indent + len(command) <= width:
        return [pad + command]
    words: list[str] = []
    word, quote = "", ""
    for ch in command:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == " ":
            words.append(word)
            word = ""
            continue
        word += ch
    words.append(word)
    lines: list[str] = []
    current = ""
    cont_pad = pad + "  "
    for w in words:
        lead = pad if not lines else cont_pad
        if current and len(lead) + len(current) + 1 + len(w) + 2 > width:
            lines.append(lead + current + " \\")
            current = w
        else:
            current = f"{current} {w}" if current else w
    lead = pad if not lines else cont_pad
    # a word longer than the room left (a sysfs path) moves left rather than past the width
    lines.append(" " * max(min(len(lead), width - len(current)), 0) + current)
    return lines


class _TrailingSpaceStripper:
    """A text stream that drops the spaces rich pads each line with: piped output (a file, `| less`,
    a diff) carries no invisible columns."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._stream.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._pending.rstrip(" "))
            self._pending = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")


def _console_file(stream: Any) -> Any:
    isatty = getattr(stream, "isatty", None)
    return stream if callable(isatty) and isatty() else _TrailingSpaceStripper(stream)


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
    return FoldingConsole(
        file=_console_file(sys.stdout), highlight=False, emoji=False, markup=markup, width=output_width()
    )


def stderr_console():
    from rich.console import Console

    return Console(
        file=_console_file(sys.stderr), highlight=False, emoji=False, width=output_width(sys.stderr)
    )
