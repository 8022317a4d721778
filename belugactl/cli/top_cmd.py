"""`belugactl top`: the rack live, from the endpoints Prometheus scrapes (workflows/top/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from belugactl.cli.options import file_option, json_option

if TYPE_CHECKING:
    from belugactl.workflows.top.model import Snapshot
    from belugactl.workflows.top.source import TopSource
    from belugactl.workflows.top.view_state import ViewState


def register(app: typer.Typer) -> None:
    @app.command("top")
    def top_cmd(
        file: Path = file_option(),
        once: bool = typer.Option(False, "--once", help="Print one snapshot (two scrapes --interval apart) and exit."),
        as_json: bool = json_option("Print the snapshot as a JSON document (implies --once)."),
        interval: float = typer.Option(
            1.0, "--interval", min=0.2, max=3600, metavar="SECONDS", help="Seconds between scrapes (rates span this)."
        ),
        timeout: float = typer.Option(
            0.8, "--timeout", min=0.05, max=60, metavar="SECONDS", help="How long one endpoint may take to answer."
        ),
    ) -> None:
        """A live view of the rack: metadata server, instances, hosts and the front door, refreshed every
        --interval from the same /metrics endpoints Prometheus scrapes (`export prometheus`).

        Keys: s cycles the sort column, r reverses it, / filters by host (Enter keeps, Esc clears), q quits.
        Rates and hit rates cover the last interval; an endpoint that does not answer is shown as down
        with the reason. --once prints one snapshot, fitted to the terminal (80 columns when piped)."""
        from dataclasses import asdict

        from belugactl.cli.load_rack import rack_context
        from belugactl.cli.render import print_json, text_width
        from belugactl.errors import set_interrupt_note
        from belugactl.workflows.top import source as top_source
        from belugactl.workflows.top.view import plain, render_lines
        from belugactl.workflows.top.view_state import ViewState

        set_interrupt_note("it only reads, nothing was changed")
        ctx = rack_context(file, as_json=as_json)
        src = top_source.TopSource.from_manifest(ctx.manifest, timeout_s=min(timeout, interval))
        if as_json or once:
            snapshot = top_source.once(src, interval)
            if as_json:
                print_json({"endpoints": [asdict(e) for e in src.endpoints], **snapshot.to_dict()})
            else:
                sys.stdout.write(plain(render_lines(snapshot, ViewState(), text_width())))
            return
        _live(src, interval)


def _live(src: TopSource, interval: float) -> None:
    from belugactl.errors import UsageError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "top's live view needs a terminal, and stdin or stdout is not one",
            fix="run it in a terminal, or take one snapshot: belugactl top -f FILE --once (--json for a document)",
        )
    from rich.console import Console
    from rich.live import Live

    from belugactl.workflows.top.live import cbreak, run_live
    from belugactl.workflows.top.view import render_lines, to_rich

    console = Console(highlight=False, emoji=False)
    waiting = f"belugactl top  rack {src.rack}: scraping {len(src.endpoints)} endpoints..."

    live = Live(console=console, screen=True, auto_refresh=False, transient=True)

    def show(snapshot: Snapshot | None, state: ViewState) -> None:  # None: before the first round
        width, height = console.size
        if snapshot is None:
            live.update(waiting, refresh=True)
            return
        live.update(to_rich(render_lines(snapshot, state, width, height, live=True)), refresh=True)

    with cbreak(sys.stdin.fileno()) as keys, live:
        run_live(src.scrape, src.build, keys, show, interval_s=interval)
