"""Typed errors an operator can act on, and the one table of exit codes.

Every error carries what happened, why, and how to fix it (pip's diagnostic style). The CLI maps
them to exit codes in exactly one place (`belugactl.cli.app.main`) and never prints a traceback
for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a check failed or an apply step failed
    USAGE = 2  # bad usage, bad manifest, bad input bytes or tool output
    ENVIRONMENT = 3  # a tool, permission or kernel feature is missing
    INTERRUPTED = 130


@dataclass
class Location:
    """Where in an input file a problem sits (1-based line and column)."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


class BelugaError(Exception):
    """Base of every error meant for an operator's eyes."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(
        self,
        what: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        where: Location | str | None = None,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.why = why
        self.fix = fix
        self.where = where

    def to_dict(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
            "where": str(self.where) if self.where is not None else None,
            "exit_code": int(self.exit_code),
        }


class UsageError(BelugaError):
    """Bad flags or arguments."""

    exit_code = ExitCode.USAGE


class InputError(BelugaError):
    """Bad input data: a manifest, tool output, bytes read from shared memory."""

    exit_code = ExitCode.USAGE


@dataclass
class ManifestProblem:
    location: Location
    path: str  # dotted field path, e.g. "hosts[3].name"
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        text = f"{self.location}: {self.path}: {self.message}" if self.path else f"{self.location}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


class ManifestError(InputError):
    """A manifest that does not validate; carries every problem found, each with its location."""

    def __init__(
        self, problems: list[ManifestProblem], *, file: str, what: str | None = None, fix: str | None = None
    ) -> None:
        self.problems = problems
        self.file = file
        first = problems[0] if problems else None
        count = len(problems)
        # `what`/`fix` name a problem with the file itself (missing, unreadable), not with its fields
        what = what or f"{file}: {count} problem{'s' if count != 1 else ''} in the manifest"
        super().__init__(
            what,
            why="\n".join(str(p) for p in problems),
            fix=fix or "correct the fields named above; `belugactl manifest check -f FILE` re-validates",
            where=first.location if first else file,
        )

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["problems"] = [
            {
                "file": p.location.file,
                "line": p.location.line,
                "column": p.location.column,
                "path": p.path,
                "message": p.message,
                "hint": p.hint,
            }
            for p in self.problems
        ]
        return data


class ToolOutputError(InputError):
    """A tool (cxl, ndctl, daxctl, ...) printed something we cannot trust."""


class EnvironmentProblem(BelugaError):
    """Something this machine lacks: a tool, a permission, a kernel feature, a free port."""

    exit_code = ExitCode.ENVIRONMENT


class StepFailed(BelugaError):
    """An apply step failed on a host."""

    exit_code = ExitCode.FAILED


class Interrupted(BelugaError):
    exit_code = ExitCode.INTERRUPTED


# What a command leaves behind if Ctrl-C lands now ("no step applied yet", "serve stopped its
# processes"): the CLI's interrupt line says it. A stack, so nested phases restore the outer note.
_interrupt_notes: list[str] = []


@contextmanager
def interrupt_note(state: str) -> Iterator[None]:
    """While the block runs, an interrupt is reported with `state` as the state left behind."""
    _interrupt_notes.append(state)
    try:
        yield
    finally:
        _interrupt_notes.pop()


def set_interrupt_note(state: str) -> None:
    """Replace the innermost note (e.g. after each applied step); outside any block, start one."""
    if _interrupt_notes:
        _interrupt_notes[-1] = state
    else:
        _interrupt_notes.append(state)


def current_interrupt_note() -> str | None:
    return _interrupt_notes[-1] if _interrupt_notes else None


def clear_interrupt_notes() -> None:
    _interrupt_notes.clear()


# The pool's own errors (belugactl/pool/ raises them; setup, doctor, serve and the data plane see them).
class PoolMismatch(InputError):
    """The pool's on-media header disagrees with the manifest, or the header is not a pool header."""


class PoolMissing(EnvironmentProblem):
    """The pool file or device is absent, unreadable or too small."""
