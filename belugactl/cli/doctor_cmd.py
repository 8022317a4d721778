"""`belugactl doctor`: every named check, one line each with ✓ ! ✗ -, the fixes, and a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from belugactl.cli.options import hidden_alias, host_option, ignore_option

# The last line on a host without CXL: the run exits 3, a health check that checked nothing is no pass.
NO_CXL_LINE = (
    "- no CXL memory devices found: nothing to check{ran}; exit 3 (--allow-no-cxl: exit 0 where no CXL is meant)"
)
STYLES = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_command(
        file: Path | None = typer.Option(
            None,
            "-f",
            "--file",
            metavar="FILE",
            help="Rack manifest: check this host against its entry.",
            envvar="BELUGA_MANIFEST",
        ),
        manifest: Path | None = hidden_alias("--manifest"),
        host_name: str | None = host_option(
            "The manifest's host entry to check against (default: the one matching the hostname)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout (stable keys)."),
        ignore: list[str] = ignore_option(
            "Downgrade this check's failure to a warning (repeat, or comma list; `all`)."
        ),
        root: Path | None = typer.Option(
            None,
            "--root",
            metavar="DIR",
            help="Check a captured or fixture host instead of this machine (directory or FILE.tar.gz).",
        ),
        list_checks: bool = typer.Option(False, "--list", help="List every check id and title, then exit."),
        verbose: bool = typer.Option(
            False, "-v", "--verbose", help="Also show each check's title and the facts behind it."
        ),
        allow_no_cxl: bool = typer.Option(
            False,
            "--allow-no-cxl",
            help="Exit 0, not 3, on a host without CXL when nothing failed (CI images, build hosts).",
        ),
    ) -> None:
        """Run the named health checks (ok / warn / fail / skip, each with its fix). Reads only; changes nothing.

        Exit 0 when no check failed, 1 when one did, 2 for bad flags, a bad manifest or a --root that is
        not a host tree, 3 when the host has no CXL at all (nothing to check; --allow-no-cxl: 0)."""
        import contextlib

        from belugactl.cli.options import checked_ignores
        from belugactl.errors import UsageError
        from belugactl.host.host import Host
        from belugactl.workflows.doctor import builtin_registry, run_doctor

        registry = builtin_registry()
        if list_checks:
            _print_list(registry, as_json)
            return
        ignores = checked_ignores(ignore)  # before any slow work: a typo should fail fast
        source = file or manifest
        if host_name is not None and source is None:
            raise UsageError("--host needs a manifest", fix="pass -f rack.yaml together with --host NAME")
        rack = None
        if source is not None:
            from belugactl.cli.load_rack import rack_context

            rack = rack_context(source, host=host_name)
        if root is not None:
            from belugactl.host.capture import open_root

            opened: Any = open_root(root)
        else:
            opened = contextlib.nullcontext(Host.local())
        with opened as host:
            if root is not None:
                require_host_tree(host, root)
            report = run_doctor(host, rack=rack, ignore=ignores, registry=registry)
        if as_json:
            from belugactl.cli.render import print_json

            print_json(report.to_dict())
        else:
            render_report(report, verbose=verbose, allow_no_cxl=allow_no_cxl)
        raise typer.Exit(code=report.exit_code_for(allow_no_cxl=allow_no_cxl))


def require_host_tree(host: Any, root: Path) -> None:
    """Refuse a --root that is not a host tree (no sys/, no proc/): every check would skip or guess."""
    from belugactl.errors import UsageError

    if not (host.path("/sys").is_dir() or host.path("/proc").is_dir()):
        raise UsageError(
            f"--root {root} is not a host tree: it has no sys/ and no proc/",
            why="doctor reads a machine's /sys and /proc under --root; in this folder there is nothing to check",
            fix="give a fixture tree (tests/fixtures/beluga-intel) or a bundle from "
            "`belugactl discover --capture bundle.tar.gz`",
        )


def _print_list(registry: Any, as_json: bool) -> None:
    if as_json:
        from belugactl.cli.render import print_json

        print_json([{"id": c.id, "title": c.title, "severity": c.severity.value} for c in registry])
        return
    width = max(len(c.id) for c in registry)
    for check in registry:
        note = "  (warning only)" if check.severity.value == "warning" else ""
        print(f"{check.id:<{width}}  {check.title}{note}")


def render_report(report: Any, *, verbose: bool = False, allow_no_cxl: bool = False) -> None:
    """Human output in the manner of flutter doctor and kubeadm preflight.

    The symbols carry the meaning; colour only decorates. Lines are not wrapped (soft wrap), so
    fixes stay copy-pasteable."""
    from rich.text import Text

    from belugactl.cli.render import stdout_console

    console = stdout_console()
    console.soft_wrap = True
    head = Text(f"belugactl doctor on {report.hostname}", style="bold")
    if report.host_entry:
        head.append(f" (as {report.host_entry} in {report.manifest})")
    console.print(head)
    for note in report.notes:
        console.print(Text(f"  • {note}", style="dim"))
    width = max((len(o.id) for o in report.outcomes), default=0)
    topic = None
    for outcome in report.outcomes:
        if outcome.topic != topic:
            topic = outcome.topic
            console.print(Text(f"\n{topic}", style="bold"))
        status = outcome.status.value
        line = Text("  ")
        line.append(f"[{outcome.status.symbol}]", style=STYLES[status])
        line.append(f" {outcome.id:<{width}}  ")
        line.append(outcome.result.reason, style="dim" if status == "skip" else "")
        console.print(line)
        if outcome.result.fix and status in ("fail", "warn"):
            fix = Text("      fix: ", style="bold")
            fix.append(outcome.result.fix)
            console.print(fix)
        if verbose:
            import json

            console.print(Text(f"      checks: {outcome.title}", style="dim"))
            if outcome.result.details:
                facts = json.dumps(outcome.result.details, sort_keys=True, default=str)
                console.print(Text(f"      facts: {facts}", style="dim"))
    summary = report.summary()
    console.print()
    console.print(
        Text(
            f"Summary: {summary['ok']} ok, {summary['warn']} warning(s), {summary['fail']} failed, "
            f"{summary['skip']} skipped ({len(report.outcomes)} checks)",
            style="bold",
        )
    )
    failed = [o.id for o in report.outcomes if o.status.value == "fail"]
    ignored = [o.id for o in report.outcomes if o.ignored]
    if ignored:
        console.print(Text(f"! failures downgraded by --ignore: {', '.join(ignored)}", style="yellow"))
    if failed:
        console.print(Text(_failed_hint(report, failed), style="red"))
    elif summary["warn"]:
        console.print(Text("! No failures; see the warnings above.", style="yellow"))
        if not report.has_cxl and not allow_no_cxl:
            console.print(Text(NO_CXL_LINE.format(ran=""), style="yellow"))
    elif any(o.status.value == "skip" for o in report.outcomes):
        _print_unchecked(console, report, allow_no_cxl=allow_no_cxl)
    else:
        console.print(Text("✓ No issues found.", style="green"))


def _failed_hint(report: Any, failed: list[str]) -> str:
    """The closing line after failures: `--ignore` is offered only for a check that does not guard data."""
    head = f"✗ {len(failed)} check(s) failed. Apply the fixes above"
    ignorable = [o.id for o in report.outcomes if o.status.value == "fail" and not o.guards_data]
    if ignorable:
        return f"{head}, or, if you know what you are doing, make one non-fatal with --ignore {ignorable[0]}"
    return f"{head}: they guard the pool's data, so do not --ignore them"


def _print_unchecked(console: Any, report: Any, *, allow_no_cxl: bool = False) -> None:
    """No failure, but checks were skipped: say what that means instead of a bare "No issues found"."""
    from collections import Counter

    from rich.text import Text

    skipped = [o for o in report.outcomes if o.status.value == "skip"]
    ran = len(report.outcomes) - len(skipped)
    if any(note.startswith("no CXL") for note in report.notes):
        console.print(
            Text(
                "- No CXL found on this host (no CXL bus, memory devices or adapters): nothing CXL could be "
                "checked, so this says nothing about serving a pool here.",
                style="yellow",
            )
        )
    topics = Counter(o.topic for o in skipped)
    console.print(Text(f"  not checked: {', '.join(f'{t} ({n})' for t, n in topics.items())}", style="dim"))
    if report.manifest is None:
        console.print(
            Text("  no manifest: pass -f rack.yaml --host H to check this host against its entry", style="dim")
        )
    if not report.has_cxl and not allow_no_cxl:
        console.print(
            Text(
                NO_CXL_LINE.format(ran=f" ({ran} generic checks passed, {len(skipped)} skipped)"),
                style="yellow",
            )
        )
        return
    console.print(Text(f"✓ No issues found in the {ran} checks that ran ({len(skipped)} skipped).", style="green"))
