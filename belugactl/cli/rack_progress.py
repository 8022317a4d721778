"""Progress of a rack command on stderr while hosts answer (stdout keeps the report or the JSON).

On a terminal, one live line (rich, gone when the command ends): the phase, how many hosts answered,
which are still awaited, and the seconds so far. Otherwise one plain line per host as it answers
(`beluga-03 doctor: ok 2.1s`), so a log shows who was slow.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from belugactl.workflows.rack.fanout import NodeResult, Progress


def word(phase: str, result: NodeResult) -> str:
    """How one host's command ended, in a word or two."""
    if result.unreachable:
        return "unreachable"
    if result.timed_out:
        return "timed out"
    if result.returncode == 0:
        return "ok"
    if phase == "doctor" and result.returncode == 1:
        return "checks fail"
    return f"exit {result.returncode}"


class PlainProgress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def phase(self, name: str, hosts: Sequence[str]) -> None:
        pass

    def answered(self, name: str, result: NodeResult) -> None:
        self.stream.write(f"{result.host} {name}: {word(name, result)} {result.duration_s:.1f}s\n")
        self.stream.flush()


class LiveProgress:
    """The state the live line is drawn from; rich redraws it from its own thread several times a second."""

    def __init__(self, verb: str) -> None:
        from rich.spinner import Spinner

        self.verb = verb
        self.phase_name = ""
        self.waiting: list[str] = []
        self.total = 0
        self.started = time.monotonic()
        self.spinner = Spinner("dots")

    def phase(self, name: str, hosts: Sequence[str]) -> None:
        self.phase_name, self.waiting, self.total = name, list(hosts), len(hosts)

    def answered(self, name: str, result: NodeResult) -> None:
        self.waiting = [h for h in self.waiting if h != result.host]

    def __rich__(self) -> Any:
        from rich.text import Text

        from belugactl.workflows.rack.fanout import fold

        answered = self.total - len(self.waiting)
        doing = f"{self.phase_name} {answered}/{self.total} answered" if self.total else "starting"
        text = f"rack {self.verb}: {doing}"
        if self.waiting:
            text += f", waiting for {fold(self.waiting)}"
        text += f" ({time.monotonic() - self.started:.0f} s)"
        self.spinner.update(text=Text(text, no_wrap=True, overflow="ellipsis"))
        return self.spinner


@contextmanager
def progress(verb: str, stream: TextIO | None = None) -> Iterator[Progress]:
    """The progress for a rack command: live on a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        yield PlainProgress(stream)
        return
    from rich.console import Console
    from rich.live import Live

    live = LiveProgress(verb)
    with Live(live, console=Console(file=stream), transient=True, refresh_per_second=8):
        yield live
