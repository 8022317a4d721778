"""The live view's keys as a state machine (no terminal here: tests press keys on it).

`s` cycles the sort column, `r` reverses it, `/` edits the host filter (typed characters apply at
once; Enter keeps it, Esc clears it), Esc clears a kept filter, `q` quits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from belugactl.workflows.top.model import InstanceView

ESC = "\x1b"
ENTER = ("\r", "\n")
BACKSPACE = ("\x7f", "\x08")


def _natural(text: str) -> list[Any]:
    """beluga-2 before beluga-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _state_rank(i: InstanceView) -> int:
    return 0 if i.state != "up" else 1 if i.router not in (None, "UP") else 2


# Column name -> (key, whether larger comes first): numbers sort largest first, unknown ones last.
SORTS: dict[str, tuple[Callable[[InstanceView], Any], bool]] = {
    "host": (lambda i: _natural(i.name), False),
    "state": (lambda i: (_state_rank(i), _natural(i.name)), False),
    "hit": (lambda i: i.hit_rate, True),
    "loaded": (lambda i: i.loaded_bytes_per_s, True),
    "saved": (lambda i: i.saved_bytes_per_s, True),
    "lookup": (lambda i: i.lookup_s, True),
    "running": (lambda i: i.running, True),
}
SORT_ORDER = tuple(SORTS)


@dataclass(frozen=True)
class ViewState:
    sort: str = "host"
    reverse: bool = False
    filter: str = ""
    editing: bool = False  # typing the filter after `/`
    quit: bool = False


def press(state: ViewState, key: str) -> ViewState:
    """The state after one key (a character, or an escape sequence such as an arrow: ignored)."""
    if state.editing:
        if key in ENTER:
            return replace(state, editing=False)
        if key == ESC:
            return replace(state, editing=False, filter="")
        if key in BACKSPACE:
            return replace(state, filter=state.filter[:-1])
        if len(key) == 1 and key.isprintable():
            return replace(state, filter=state.filter + key)
        return state
    if key == "q":
        return replace(state, quit=True)
    if key == "s":
        nxt = SORT_ORDER[(SORT_ORDER.index(state.sort) + 1) % len(SORT_ORDER)]
        return replace(state, sort=nxt, reverse=False)
    if key == "r":
        return replace(state, reverse=not state.reverse)
    if key == "/":
        return replace(state, editing=True)
    if key == ESC:
        return replace(state, filter="")
    return state


def visible(instances: list[InstanceView], state: ViewState) -> list[InstanceView]:
    """The instances whose host name contains the filter, in the chosen order (unknown values last)."""
    shown = [i for i in instances if state.filter.lower() in i.host.lower()]
    key, larger_first = SORTS[state.sort]
    known = [i for i in shown if key(i) is not None]
    unknown = [i for i in shown if key(i) is None]
    known.sort(key=key, reverse=larger_first != state.reverse)
    unknown.sort(key=lambda i: _natural(i.name))
    return known + unknown
