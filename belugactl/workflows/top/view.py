"""A snapshot as lines of text for a width: the live screen (styled) and `--once` (plain).

Every line fits the width: header facts are whole words that wrap as units, the instance table drops
its rightmost columns on a narrow terminal rather than fold, and a down instance shows why in place
of the figures it does not have.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from belugactl.workflows.top.view_state import ViewState, visible

if TYPE_CHECKING:
    from belugactl.workflows.top.model import InstanceView, MetadataView, RouterView, Snapshot

Segment = tuple[str, str | None]  # text, rich style
Line = list[Segment]

KEYS_HELP = "keys: s sort  r reverse  / filter  q quit"
STATE_STYLE = {"up": "green", "UP": "green", "partial": "yellow", "not ready": "yellow", "down": "bold red",
               "DOWN": "bold red", "?": "yellow"}  # fmt: skip


def fmt_bytes(n: float | None, *, compact: bool = False) -> str:
    """1.5 MiB (compact: 1.5M); None is "-"."""
    if n is None:
        return "-"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    text = f"{value:.0f}" if unit == 0 else f"{value:.1f}"
    if compact:
        return text + ("" if unit == 0 else units[unit][0])
    return f"{text} {units[unit]}"


def fmt_rate(n: float | None) -> str:
    return "-" if n is None else f"{fmt_bytes(n)}/s"


def fmt_count(n: float | None) -> str:
    """1234 -> 1.2k; 0.4 -> 0.4 (a rate)."""
    if n is None:
        return "-"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}k"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}" if n == int(n) or n >= 10 else f"{n:.1f}"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}us"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def node_set(names: list[str]) -> str:
    """beluga-03, beluga-07 -> beluga-[03,07] (ClusterShell's node set)."""
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(names)) if names else ""


def wrap_pieces(pieces: list[str], width: int, *, first: int = 0, indent: int = 2) -> list[str]:
    """Whole pieces, two spaces apart, on lines of at most `width`; the first line starts at column
    `first`, the others at `indent` (a piece longer than the width stays whole, on its own line)."""
    lines: list[str] = []
    current = ""
    for piece in pieces:
        if not current:
            current = " " * (indent if lines else first) + piece
        elif len(current) + 2 + len(piece) <= width:
            current += "  " + piece
        else:
            lines.append(current)
            current = " " * indent + piece
    if current:
        lines.append(current)
    return lines


def wrap_words(text: str, width: int, *, indent: int) -> list[str]:
    """Prose wrapped at `width`, continuation lines indented; words are never split."""
    import textwrap

    return textwrap.wrap(
        text, width=width, subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False
    ) or [""]


def fit(line: Line, width: int, *, indent: int = 10) -> list[Line]:
    """A styled line wrapped between its segments (each stays whole) onto lines of at most `width`;
    a continuation starts at `indent`, without the segment's leading separator."""
    out: list[Line] = [[]]
    used = 0
    for text, style in line:
        if used and used + len(text) > width:
            text = text.lstrip(",;: ")
            out.append([(" " * indent, None)])
            used = indent
        out[-1].append((text, style))
        used += len(text)
    return out


def _styled(text: str, style: str | None = None) -> Line:
    return [(text, style)]


def _title(snap: Snapshot, state: ViewState) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(snap.wall))
    every = f"every {snap.interval_s:.1f}s" if snap.interval_s else "first scrape"
    sort = f"sort {state.sort}" + (" reversed" if state.reverse else "")
    parts = ["belugactl top", f"rack {snap.rack}", when, every, sort]
    if state.filter:
        parts.append(f"host filter '{state.filter}'")
    return "  ".join(parts)


def metadata_lines(md: MetadataView | None, width: int) -> list[Line]:
    if md is None:
        return [_styled("metadata  none in the manifest (no host has the metadata role)", "yellow")]
    head: Line = [(f"metadata  {md.host} {md.address}  ", None), (md.state, STATE_STYLE.get(md.state))]
    if md.state == "down":
        head.append((f": {md.error}", "red"))
        return fit(head, width)
    if md.epoch is not None:
        head.append((f", epoch {md.epoch}", None))
    if md.restarted:
        head.append((" (restarted since the last scrape)", "yellow"))
    pool = f"pool {fmt_bytes(md.used_bytes)} of {fmt_bytes(md.capacity_bytes)}"
    if md.used_bytes is not None and md.capacity_bytes:
        pool += f" ({fmt_pct(md.used_bytes / md.capacity_bytes)})"
    facts = [
        pool,
        f"entries {fmt_count(md.entries)}",
        f"leases {fmt_count(md.leases)}",
        f"evictions {fmt_count(md.evictions)} ({fmt_count(md.evictions_per_s)}/s)",
        f"hit {fmt_pct(md.hit_rate)} of {fmt_count(md.lookups_per_s)} lookups/s" if md.lookups_per_s else "hit -",
        f"loaded {fmt_rate(md.loaded_bytes_per_s)}",
        f"saved {fmt_rate(md.saved_bytes_per_s)}",
        f"requests {fmt_count(md.requests_per_s)}/s",
        f"latency p50 {fmt_seconds(md.p50_s)} p99 {fmt_seconds(md.p99_s)}",
    ]
    return [*fit(head, width), *[_styled(line) for line in wrap_pieces(facts, width, first=2)]]


def router_lines(routers: list[RouterView], width: int) -> list[Line]:
    lines: list[Line] = []
    for r in routers:
        line: Line = [(f"router    {r.host} {r.address}  ", None), (r.state, STATE_STYLE.get(r.state))]
        if r.state == "down":
            line.append((f": {r.error}", "red"))
        elif r.kind == "pd-proxy":
            line.append((f", P/D proxy, {fmt_count(r.requests)} requests", None))
        else:
            line.append((f", backends {r.backends_up}/{len(r.backends)} up", None))
            not_up = [name for name, s in r.backends.items() if s != "UP"]
            if not_up:
                line.append((f"; not up: {node_set(not_up)}", "red"))
        lines += fit(line, width)
    return lines


def hosts_line(snap: Snapshot) -> Line:
    by_state: dict[str, list[str]] = {}
    for h in snap.hosts:
        by_state.setdefault(h.state, []).append(h.name)
    line: Line = [(f"hosts {len(snap.hosts)}: ", None)]
    parts = []
    for state in ("up", "partial", "down", "-"):
        names = by_state.get(state, [])
        if state != "up" and not names:
            continue
        label = "without an instance" if state == "-" else state
        text = f"{len(names)} {label}" + (f" ({node_set(names)})" if names and state != "up" else "")
        parts.append((text, STATE_STYLE.get(state) if names and state != "up" else None))
    for i, part in enumerate(parts):
        line.append(part if i == 0 else (", " + part[0], part[1]))
    return line


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: Callable[[InstanceView], str]
    right: bool = True


def _columns(rows: list[InstanceView]) -> list[Column]:
    host_w = max([4, *(len(i.host) for i in rows)])
    inst_w = max([4, *(len(i.short) for i in rows)])
    return [
        Column("HOST", host_w, lambda i: i.host, right=False),
        Column("INST", inst_w, lambda i: i.short, right=False),
        Column("STATE", 5, lambda i: i.state, right=False),
        Column("HIT%", 6, lambda i: fmt_pct(i.hit_rate)),
        Column("LOAD/s", 7, lambda i: fmt_bytes(i.loaded_bytes_per_s, compact=True)),
        Column("SAVE/s", 7, lambda i: fmt_bytes(i.saved_bytes_per_s, compact=True)),
        Column("LOOKUP", 7, lambda i: fmt_seconds(i.lookup_s)),
        Column("RUN/WAIT", 8, lambda i: "-" if i.running is None else f"{i.running}/{i.waiting or 0}"),
        Column("ROUTER", 6, lambda i: i.router or "-"),
    ]


def _fit(columns: list[Column], width: int) -> list[Column]:
    """Drop columns from the right until the row fits (host, instance and state always stay)."""
    while len(columns) > 3 and sum(c.width + 1 for c in columns) - 1 > width:
        columns = columns[:-1]
    return columns


def _cell(col: Column, text: str) -> str:
    return text.rjust(col.width) if col.right else text.ljust(col.width)


def table_lines(rows: list[InstanceView], width: int) -> list[Line]:
    columns = _fit(_columns(rows), width)
    out: list[Line] = [_styled(" ".join(_cell(c, c.title) for c in columns).rstrip(), "bold")]
    for i in rows:
        first = " ".join(_cell(c, c.cell(i)) for c in columns[:2]) + " "
        if i.state != "up":
            why = f"down: {i.error}" if i.error else "down"
            out.append([(first, None), (why[: max(width - len(first), 4)], "bold red")])
            continue
        line: Line = [(first, None), (_cell(columns[2], i.state), STATE_STYLE.get(i.state))]
        for col in columns[3:]:
            text = col.cell(i)
            style = STATE_STYLE.get(text) if col.title == "ROUTER" else None
            line.append((" ", None))
            line.append((_cell(col, text), style))
        out.append(line)
    return out


def render_lines(
    snap: Snapshot, state: ViewState, width: int, height: int | None = None, *, live: bool = False
) -> list[Line]:
    """The whole view. `height`: the screen's rows (the table is cut to fit, saying how many are left)."""
    lines: list[Line] = [_styled(line, "bold") for line in wrap_pieces(_title(snap, state).split("  "), width)]
    lines += metadata_lines(snap.metadata, width)
    lines += router_lines(snap.routers, width)
    lines += fit(hosts_line(snap), width, indent=6)
    for note in snap.notes:
        lines += [_styled(line, "yellow") for line in wrap_words(f"note: {note}", width, indent=6)]
    lines.append(_styled(""))
    rows = visible(snap.instances, state)
    table = table_lines(rows, width)
    footer: list[Line] = []
    if state.filter or len(rows) != len(snap.instances):
        footer.append(_styled(f"{len(rows)} of {len(snap.instances)} instances (host filter '{state.filter}')"))
    if live:
        if state.editing:
            footer.append(_styled(f"filter hosts: {state.filter}_   (Enter keep, Esc clear)", "reverse"))
        else:
            footer.append(_styled(KEYS_HELP, "dim"))
    if height is not None:
        room = height - len(lines) - len(footer)
        if room < 2:  # a screen too short for the header: keep the footer (the filter being typed)
            keep = max(height - len(footer) - 1, 0)
            hidden = len(lines) + len(table) - keep
            return [*lines[:keep], _styled(f"... {hidden} lines hidden (a taller screen shows them)", "dim"), *footer]
        if len(table) > room:
            hidden = len(table) - (room - 1)
            table = [*table[: room - 1], _styled(f"... {hidden} more (filter with /)", "dim")]
    return lines + table + footer


def plain(lines: list[Line]) -> str:
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines) + "\n"


def to_rich(lines: list[Line]) -> Any:
    """The lines as one rich Text (styles kept), for the live screen."""
    from rich.text import Text

    text = Text(no_wrap=True, overflow="crop")
    for n, line in enumerate(lines):
        if n:
            text.append("\n")
        for segment, style in line:
            text.append(segment, style=style or "")
    return text
