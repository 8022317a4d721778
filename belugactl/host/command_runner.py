"""Running external commands: argv lists only, a timeout, captured output, errno names.

The ndctl family (`cxl`, `ndctl`, `daxctl`) exits with `-errno & 0xff` on failure, so exit status
237 means -19 (ENODEV). `CommandResult.errno_name` turns that back into a name an operator can search.
Tests swap the real runner for a `RecordedRunner` that replays captured outputs.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

NDCTL_FAMILY = frozenset({"cxl", "ndctl", "daxctl"})

# Returned when the program does not exist; the shell uses the same number.
RC_NOT_FOUND = 127
RC_TIMEOUT = 124


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    not_found: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""

    @property
    def errno_name(self) -> str | None:
        """For the ndctl tools, the errno behind a failing exit status (237 -> ENODEV)."""
        if self.returncode == 0 or self.not_found or self.timed_out:
            return None
        if self.program not in NDCTL_FAMILY:
            return None
        return errno.errorcode.get(256 - self.returncode)

    def describe(self) -> str:
        """One line for error messages: the command, its status and the first line of stderr."""
        status = "timed out" if self.timed_out else (
            "not found" if self.not_found else f"exit {self.returncode}"
        )
        if self.errno_name:
            status += f" ({self.errno_name})"
        first = self.stderr.strip().splitlines()[0] if self.stderr.strip() else ""
        text = f"`{' '.join(self.argv)}` {status}"
        return f"{text}: {first}" if first else text

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> CommandResult:
        return cls(
            argv=tuple(str(a) for a in data["argv"]),  # type: ignore[union-attr]
            returncode=int(data["returncode"]),  # type: ignore[arg-type]
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            duration_s=float(data.get("duration_s", 0.0)),  # type: ignore[arg-type]
            timed_out=bool(data.get("timed_out", False)),
            not_found=bool(data.get("not_found", False)),
        )


class Runner(Protocol):
    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None
    ) -> CommandResult: ...


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str):
        # A shell string would be split (or worse, interpreted); refuse it outright.
        raise TypeError("commands are argv lists, never shell strings")
    if not argv:
        raise ValueError("empty command")
    return tuple(str(a) for a in argv)


class SubprocessRunner:
    """Runs real processes on this machine."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        args = _check_argv(argv)
        start = time.monotonic()
        try:
            proc = subprocess.run(  # noqa: S603 - argv list, no shell
                list(args),
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except FileNotFoundError as exc:
            return CommandResult(args, RC_NOT_FOUND, "", str(exc), time.monotonic() - start, not_found=True)
        except PermissionError as exc:
            return CommandResult(args, 126, "", str(exc), time.monotonic() - start)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return CommandResult(args, RC_TIMEOUT, out, err, time.monotonic() - start, timed_out=True)
        return CommandResult(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


class RecordedRunner:
    """Replays captured command results, keyed by argv (the hardware boundary's stand-in in tests).

    A command that was not recorded behaves like a program that does not exist, so code under test
    sees the same thing it would on a machine without that tool.
    """

    def __init__(self, results: Iterable[CommandResult] = ()) -> None:
        self._results: dict[tuple[str, ...], CommandResult] = {}
        self.calls: list[tuple[str, ...]] = []
        for result in results:
            self.add(result)

    def add(self, result: CommandResult) -> None:
        self._results[self._key(result.argv)] = result

    @staticmethod
    def _key(argv: Sequence[str]) -> tuple[str, ...]:
        # Recorded on one machine, replayed on another: the program's directory does not matter.
        args = tuple(argv)
        return (os.path.basename(args[0]), *args[1:]) if args else args

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        args = _check_argv(argv)
        self.calls.append(args)
        found = self._results.get(self._key(args))
        if found is None:
            return CommandResult(args, RC_NOT_FOUND, "", f"{args[0]}: not recorded", not_found=True)
        return CommandResult(
            args, found.returncode, found.stdout, found.stderr, found.duration_s, found.timed_out, found.not_found
        )

    @classmethod
    def load(cls, path: Path) -> RecordedRunner:
        data = json.loads(path.read_text())
        return cls(CommandResult.from_dict(item) for item in data.get("commands", []))


@dataclass
class RecordingRunner:
    """Wraps another runner and keeps every result, for support bundles and fixtures."""

    inner: Runner
    results: list[CommandResult] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        result = self.inner.run(argv, timeout=timeout, input=input)
        self.results.append(result)
        return result

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"commands": [r.to_dict() for r in self.results]}, indent=1) + "\n")
