"""The live view's loop: a thread scrapes every interval, the main thread reads keys and redraws.

Keys stay responsive while a round waits on a slow endpoint (up to the scrape timeout), and a round
that fails to reach anything is drawn like any other: the view never stops for an endpoint.
"""

from __future__ import annotations

import os
import queue
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from belugactl.workflows.top.view_state import ESC, ViewState, press

if TYPE_CHECKING:
    from belugactl.workflows.top.model import Snapshot
    from belugactl.workflows.top.scrape import Round

KEY_POLL_S = 0.1  # how long a redraw can wait for a key or a round


class Keys(Protocol):
    def read(self, timeout_s: float) -> list[str]:
        """The keys pressed, waiting up to `timeout_s` for the first."""
        ...


def split_keys(text: str) -> list[str]:
    """Characters as keys; an escape sequence (an arrow: ESC [ A) is one key, a lone ESC is ESC."""
    keys: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == ESC and i + 1 < len(text) and text[i + 1] in "[O":
            j = i + 2
            while j < len(text) and not (text[j].isalpha() or text[j] == "~"):
                j += 1
            keys.append(text[i : j + 1])
            i = j + 1
        else:
            keys.append(text[i])
            i += 1
    return keys


class TerminalKeys:
    """Keys from a terminal file descriptor, read without waiting for Enter (see `cbreak`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, timeout_s: float) -> list[str]:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        data = os.read(self.fd, 256)
        if not data:  # the terminal went away: quit as if asked
            return ["q"]
        return split_keys(data.decode("utf-8", "replace"))


@contextmanager
def cbreak(fd: int) -> Iterator[TerminalKeys]:
    """The terminal in cbreak mode (keys one at a time, no echo; Ctrl-C still interrupts), restored after."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield TerminalKeys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_live(
    scrape: Callable[[], Round],
    build: Callable[[Round | None, Round], Snapshot],
    keys: Keys,
    show: Callable[[Snapshot | None, ViewState], None],
    *,
    interval_s: float,
) -> ViewState:
    """Redraw on every round and every key until `q`; returns the last state."""
    rounds: queue.Queue[Round] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            started = time.monotonic()
            result = scrape()
            if stop.is_set():
                return
            while not stop.is_set():
                try:
                    rounds.put(result, timeout=KEY_POLL_S)
                    break
                except queue.Full:
                    continue
            stop.wait(max(interval_s - (time.monotonic() - started), 0.0))

    thread = threading.Thread(target=scraper, name="top-scraper", daemon=True)
    thread.start()
    state = ViewState()
    snapshot: Snapshot | None = None
    previous: Round | None = None
    show(snapshot, state)
    try:
        while not state.quit:
            changed = False
            for key in keys.read(KEY_POLL_S):
                state = press(state, key)
                changed = True
            try:
                current = rounds.get_nowait()
            except queue.Empty:
                pass
            else:
                snapshot = build(previous, current)
                previous = current
                changed = True
            if changed and not state.quit:
                show(snapshot, state)
    finally:
        stop.set()
    return state
