"""`belugactl rack ...` as text that fits the terminal at any rack size.

Summary first (each host in one state: ok, failing, unreachable, not run), then each problem once with
the hosts it is on as a node set (`beluga-[03,07]`), then the unreachable hosts with the transport's
reason and a fix. The hosts x checks matrix is printed when it fits the width, or with `--matrix`, where
columns take the part of the names that differs (`00`..`15` under `beluga-`) and the matrix splits into
blocks of hosts rather than fold a name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from belugactl.cli.render import text_width, wrap_hanging

SYMBOL = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-", None: "?"}
LEGEND = "✓ ok  ! warn  ✗ fail  - skipped  ? no answer"
PROBE_LEGEND = "row: the host reading; column: the host whose record it read; ✓ seen  ✗ not seen  ? no answer"
SETUP_LEGEND = "✓ applied  + planned  ✗ not done or failed"
DETAIL = 6  # where a problem's reason, fix and output start
STATE_WIDTH = 15  # "  unreachable" and two spaces


def render_doctor(report: Any, *, matrix: bool | None) -> None:
    width = text_width()
    summary = report.summary()
    lines = _head(summary, width)
    lines += _findings(summary, width)
    lines += _unreachable(summary, width)
    lines += _doctor_matrices(report, matrix, width)
    if report.timings:
        lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.timings.items()))
    lines += _verdict(summary, width)
    _print(lines)


def render_run(run: Any, *, matrix: bool | None) -> None:
    from belugactl.workflows.rack.fanout import fold

    width = text_width()
    summary = run.summary()
    lines = []
    if len(run.order) > 1:
        lines += wrap_hanging("order: " + " -> ".join(fold(p) for p in run.order), width, first=0, indent=7)
    lines += _head(summary, width)
    lines += _findings(summary, width)
    lines += _unreachable(summary, width)
    if run.verb == "setup":
        lines += _matrix_or_hint("hosts x steps", setup_rows(run), run.hosts, matrix, width, SETUP_LEGEND)
    if run.verb == "status":
        lines += leader_lines(run, width)
    lines += _verdict(summary, width)
    _print(lines)


def _print(lines: list[str]) -> None:
    from rich.text import Text

    from belugactl.cli.render import stdout_console

    console = stdout_console(markup=False)
    for line in lines:
        style = "red" if line.startswith("✗") else "yellow" if line.startswith("!") else ""
        console.print(Text(line, style=style), soft_wrap=True)


def _utc(ts: Any) -> str:
    import datetime as dt

    if not isinstance(ts, int | float) or ts <= 0:
        return "?"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def leader_lines(run: Any, width: int) -> list[str]:
    """Who leads, since when, leader changes, per metadata server that answered `status` (an elected
    one: metadata-server --standby); two servers that each say they lead, or name different leaders, are
    said with ✗."""
    from belugactl.workflows.rack.orchestrate import metadata_servers

    rows = metadata_servers(run)
    if not rows:
        return []
    lines = ["", "metadata servers:"]
    for row in rows:
        if row["role"] in ("serves", "not ready"):
            text = f"{row['role']} (not elected), epoch {row['epoch']}"
        elif row["role"] == "leader":
            text = f"leads since {_utc(row['leader_since'])}, epoch {row['epoch']}"
        elif row["leader"]:
            text = f"standby; {row['leader']} leads since {_utc(row['leader_since'])}"
        else:
            text = "standby; no leader yet"
        if row["role"] in ("leader", "standby"):
            text += f", {row['leader_changes'] or 0} leader change(s) seen"
        lines += _prefixed(f"  {row['host']}  ", text, width, indent=DETAIL)
    leading = [r["host"] for r in rows if r["role"] == "leader"]
    named = {r["leader"] for r in rows if r["role"] in ("leader", "standby") and r["leader"]}
    if len(leading) > 1:
        said = f"{len(leading)} servers say they lead: {', '.join(leading)} (an old term ends by its deadline)"
        lines += _prefixed("✗ ", said, width, indent=2)
    elif len(named) > 1:
        lines += _prefixed("! ", f"the servers name different leaders: {', '.join(sorted(named))}", width, indent=2)
    return lines


# --- the summary ---------------------------------------------------------------------------------


def _head(summary: Any, width: int) -> list[str]:
    from belugactl.workflows.rack.fanout import fold

    counts = [f"{len(summary.ok)} ok"]
    counts += [
        f"{len(hs)} {name}"
        for name, hs in (
            ("failing", summary.failing),
            ("unreachable", list(summary.unreachable)),
            ("not run", summary.not_run),
        )
        if hs
    ]
    lines = [f"rack {summary.verb}: {len(summary.hosts)} host(s): {', '.join(counts)}"]
    groups = summary.outcomes if summary.outcomes and summary.ok else {"ok": summary.ok}
    rows = [(name, hs) for name, hs in groups.items() if hs]
    rows += [
        ("failing", summary.failing),
        ("unreachable", [h for h in summary.hosts if h in summary.unreachable]),
        ("not run", summary.not_run),
    ]
    rows = [(name, hosts) for name, hosts in rows if hosts]
    pad = max(STATE_WIDTH, *(len(name) + 4 for name, _ in rows))
    for name, hosts in rows:
        lines += _prefixed(f"  {name}".ljust(pad), fold(hosts), width, indent=pad)
    return lines


def _findings(summary: Any, width: int) -> list[str]:
    from belugactl.workflows.rack.fanout import fold

    lines: list[str] = []
    for finding in summary.findings:
        lines.append("")
        head = f"{SYMBOL[finding.status]} {finding.id} on "
        lines += _prefixed(head, fold(finding.hosts), width)
        fixes = {v.fix for v in finding.variants}
        shared_fix = fixes.pop() if len(fixes) == 1 else None
        for variant in finding.variants:
            if len(finding.variants) == 1:
                lines += _prose(variant.reason, width)
            else:
                lines += _prefixed(
                    " " * (DETAIL - 2) + fold(variant.hosts) + ": ", variant.reason, width, indent=DETAIL
                )
            lines += [line for text in variant.detail for line in _prose(text, width, indent=DETAIL + 2)]
            if variant.fix and shared_fix is None:
                lines += _fix(variant.fix, width)
        if shared_fix:
            lines += _fix(shared_fix, width)
    return lines


def _unreachable(summary: Any, width: int) -> list[str]:
    """Unreachable hosts, grouped by fix, then by reason (one node set when the words are the same)."""
    from belugactl.workflows.rack.fanout import fold

    if not summary.unreachable:
        return []
    unchecked = "not checked" if summary.verb == "doctor" else "nothing run there"
    lines = ["", f"? unreachable, {unchecked}: {fold([h for h in summary.hosts if h in summary.unreachable])}"]
    by_fix: dict[str, dict[str, list[str]]] = {}
    for host in summary.hosts:
        if host in summary.unreachable:
            why = summary.unreachable[host]
            by_fix.setdefault(why.fix, {}).setdefault(why.reason, []).append(host)
    for fix, reasons in by_fix.items():
        for reason, hosts in reasons.items():
            lines += _prefixed(" " * (DETAIL - 4) + fold(hosts) + ": ", reason, width, indent=DETAIL)
        lines += _fix(fix, width)
    return lines


def _verdict(summary: Any, width: int) -> list[str]:
    from belugactl.workflows.rack.fanout import fold

    if summary.exit_code == 0:
        return ["", f"✓ {summary.verb}: all {len(summary.hosts)} host(s) ok"]
    parts = []
    if summary.failing:
        parts.append(f"{len(summary.failing)} failing: {fold(summary.failing)}")
    if summary.unreachable:
        parts.append(f"{len(summary.unreachable)} unreachable: {fold(list(summary.unreachable))}")
    if summary.not_run:
        parts.append(f"{len(summary.not_run)} not run: {fold(summary.not_run)}")
    return [
        "",
        *wrap_hanging(f"✗ {summary.verb} (exit {summary.exit_code}): {'; '.join(parts)}", width, first=0, indent=2),
    ]


def _prefixed(prefix: str, text: str, width: int, *, indent: int = DETAIL) -> list[str]:
    wrapped = wrap_hanging(text, width, first=len(prefix), indent=indent)
    return [prefix + wrapped[0], *wrapped[1:]]


def _prose(text: str, width: int, *, indent: int = DETAIL) -> list[str]:
    wrapped = wrap_hanging(text, width, first=indent, indent=indent)
    return [" " * indent + wrapped[0], *wrapped[1:]]


def _fix(fix: str, width: int) -> list[str]:
    from belugactl.cli.doctor_cmd import fix_lines  # doctor's layout: prose wrapped, each command a line

    return fix_lines(fix, width)


# --- the matrices --------------------------------------------------------------------------------


def doctor_rows(report: Any) -> list[tuple[str, list[str]]]:
    hosts = report.hosts
    away = report.unreachable  # their skew row says "fail": nothing could be compared there
    rows = [
        ("version.skew", ["?" if h in away else SYMBOL.get(report.skew.get(h, {}).get("status"), "?") for h in hosts])
    ]
    for check_id, cells in report.checks.items():
        rows.append((check_id, [_cell(cells.get(h)) for h in hosts]))
    return rows


def probe_rows(report: Any) -> list[tuple[str, list[str]]]:
    def cell(reader: str, writer: str) -> str:
        cells = report.probe.get(reader) or {}
        if writer not in cells:
            return "?"
        return SYMBOL["ok"] if cells[writer].get("status") == "ok" else SYMBOL["fail"]

    return [(reader, [cell(reader, w) for w in report.hosts]) for reader in report.hosts]


def setup_rows(run: Any) -> list[tuple[str, list[str]]]:
    steps: dict[str, dict[str, str]] = {}
    for host, doc in run.documents.items():
        report = doc.get("report", doc) if isinstance(doc, dict) else {}
        for item in report.get("applied", []):
            steps.setdefault(item["step"]["id"], {})[host] = "✓"
        for item in report.get("remaining", []):
            steps.setdefault(item["id"], {})[host] = "+" if report.get("dry_run") else "✗"
        if report.get("failed"):
            steps.setdefault(report["failed"], {})[host] = "✗"
    return [(step, [cells.get(h, "") for h in run.hosts]) for step, cells in steps.items()]


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "?"
    return SYMBOL.get(cell.get("status"), "?") + ("*" if cell.get("ignored") else "")


def _doctor_matrices(report: Any, matrix: bool | None, width: int) -> list[str]:
    lines = _matrix_or_hint("hosts x checks", doctor_rows(report), report.hosts, matrix, width, LEGEND)
    if report.probe is None:
        return lines
    readers = [h for h in report.hosts if h in report.probe]
    all_ok = not report.probe_errors and all(c.get("status") == "ok" for h in readers for c in report.probe[h].values())
    hinted = bool(lines) and lines[-1].endswith(HINT)
    if readers and all_ok:
        lines += ["", f"pool probe: {len(readers)} host(s) read each other's probe records: all ok"]
        if matrix is None and hinted:
            return lines  # the probe matrix would say nothing more than that line
    return lines + _matrix_or_hint("pool probe", probe_rows(report), report.hosts, matrix, width, PROBE_LEGEND)


HINT = "--matrix prints it"


def _matrix_or_hint(
    title: str, rows: list[tuple[str, list[str]]], hosts: list[str], wanted: bool | None, width: int, legend: str
) -> list[str]:
    if not rows or wanted is False:
        return []
    head = ["", *wrap_hanging(f"{title}: {legend}", width, first=0, indent=2)]
    full = matrix_lines(rows, hosts, hosts, width)
    if full is not None:
        return [*head, *full]
    if wanted is None:
        return [
            "",
            *wrap_hanging(
                f"{title}: {len(hosts)} host columns do not fit {width} columns; {HINT}", width, first=0, indent=2
            ),
        ]
    labels, prefix = column_labels(hosts)
    lines = head
    if prefix:
        lines.append(f"columns: host names after {prefix!r}")
    for start, end in _blocks(rows, labels, width):
        lines += matrix_lines(rows, hosts[start:end], labels[start:end], width, columns=range(start, end)) or []
    return lines


def matrix_lines(
    rows: list[tuple[str, list[str]]],
    hosts: Sequence[str],
    labels: Sequence[str],
    width: int,
    *,
    columns: Sequence[int] | None = None,
) -> list[str] | None:
    """The matrix as lines, or None when it is wider than `width`."""
    columns = list(columns if columns is not None else range(len(hosts)))
    first = max(len(name) for name, _ in rows)
    cell = max(max(len(label) for label in labels), 2)
    if first + 1 + len(columns) * (cell + 1) > width:
        return None
    lines = [(" " * first + "".join(" " + label.rjust(cell) for label in labels)).rstrip()]
    for name, cells in rows:
        lines.append((name.ljust(first) + "".join(" " + cells[i].rjust(cell) for i in columns)).rstrip())
    return lines


def column_labels(hosts: Sequence[str]) -> tuple[list[str], str]:
    """The part of each name after what they all share (`beluga-07` -> `07`), and the shared prefix;
    the names themselves when that part would be empty or the same twice."""
    prefix = os.path.commonprefix(list(hosts)) if len(hosts) > 1 else ""
    prefix = prefix.rstrip("0123456789")  # keep numbers whole: beluga-0..beluga-15 -> 0..15
    labels = [h[len(prefix) :] for h in hosts]
    if not prefix or not all(labels) or len(set(labels)) != len(labels):
        return list(hosts), ""
    return labels, prefix


def _blocks(rows: list[tuple[str, list[str]]], labels: list[str], width: int) -> list[tuple[int, int]]:
    """Runs of columns, each as many as fit the width (at least one)."""
    first = max(len(name) for name, _ in rows)
    cell = max(max(len(label) for label in labels), 2)
    per = max(1, (width - first - 1) // (cell + 1))
    return [(i, min(i + per, len(labels))) for i in range(0, len(labels), per)]
