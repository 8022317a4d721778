"""`belugactl plan | setup | teardown`: what would change, make it so, undo it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from belugactl.cli.options import file_option, host_option, topics_option

FILE_HELP = "The rack manifest (YAML)."
HOST_HELP = "Which manifest host this machine is (default: the one matching this hostname)."
ROOT_HELP = (
    "Plan for a fixture tree or a captured host (directory or FILE.tar.gz from `discover --capture`) "
    "instead of this machine. Read-only: setup and teardown take it only with --dry-run."
)
# The topics in planning order, spelled here so --help need not import them (tests/cli/test_readme_agrees.py
# compares this with workflows/setup/topics/).
TOPICS = "autoonline, region, devdax, permissions, header, hugepages, thp, ddio, mtrr, secret"
WRITE_ROOT_HELP = "Let setup/teardown write into the --root tree (tests of the apply path on fake machines)."


@contextmanager
def _load(file: Path, host_name: str | None, root: Path | None) -> Iterator[tuple[Any, Any]]:
    """(Host, SetupTarget) for this machine, or for the tree or bundle given with --root."""
    from belugactl.cli.load_rack import rack_context
    from belugactl.host.host import Host
    from belugactl.workflows.setup.target import target_from_context

    target = target_from_context(rack_context(file, host=host_name))
    if root is None:
        yield Host.local(), target
        return
    from belugactl.cli.doctor_cmd import require_host_tree
    from belugactl.host.capture import open_root

    with open_root(root) as host:
        require_host_tree(host, root)
        yield host, target


def _refuse_writing_root(verb: str, root: Path | None, dry_run: bool, write_root: bool) -> None:
    """--root previews a plan; a real setup or teardown on a captured tree would change a copy, not a host."""
    from belugactl.errors import UsageError

    if root is not None and not dry_run and not write_root:
        raise UsageError(
            f"{verb} --root {root} would change the files of that tree, not a host",
            why="--root is for previewing a plan from a fixture tree or a captured bundle",
            fix=f"preview it: belugactl {verb} --dry-run ... --root {root} (or belugactl plan ... --root {root})",
        )


def _topics(only: str | None) -> list[str] | None:
    if not only:
        return None
    import difflib

    from belugactl.cli.completion import setup_topic_ids
    from belugactl.errors import UsageError

    known = setup_topic_ids()
    chosen = [t.strip() for t in only.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        close = [m for t in unknown for m in difflib.get_close_matches(t, known, n=1)]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(
            f"unknown topic(s) for --only: {', '.join(unknown)}{hint}", fix=f"choose from {', '.join(known)}"
        )
    return chosen


def _confirm(plan, yes: bool, verb: str) -> None:  # plan: belugactl.model.setup_plan.Plan
    from belugactl.errors import UsageError

    risky = plan.destructive
    if not risky or yes:
        return
    lines = "\n".join(f"  {s.id}: {s.summary}" for s in risky)
    if not sys.stdin.isatty():
        raise UsageError(
            f"{verb} would destroy data and this is not an interactive terminal",
            why=lines,
            fix="rerun with --yes to confirm",
        )
    print(f"{verb} will DESTROY DATA:\n{lines}", file=sys.stderr)
    answer = input("type 'yes' to continue: ")
    if answer.strip() != "yes":
        raise typer.Abort()


def converged_text(plan) -> str:  # plan: Plan
    """What a plan without steps means, said truly: nothing to undo is not "matches the manifest"."""
    if plan.verb == "teardown":
        return "nothing to tear down (no object that setup made is on this host)"
    if plan.skipped:
        return f"no changes in the topics planned ({len(plan.skipped)} skipped, see below)"
    return "no changes (the host matches the manifest)"


def render_plan(plan, *, stream=None) -> None:  # plan: Plan
    out = stream or sys.stdout
    ready = [s for s in plan.steps if not s.deferred]
    deferred = len(plan.steps) - len(ready)
    if plan.converged:
        print(f"{plan.host}: {plan.verb}: {converged_text(plan)}", file=out)
    else:
        extra = f", {deferred} planned once earlier steps have run" if deferred else ""
        print(f"{plan.host}: {plan.verb}: {len(plan.steps)} step(s){extra}", file=out)
    for i, step in enumerate(plan.steps, 1):
        mark = "  DESTROYS DATA" if step.destroys_data else ""
        later = "  (after earlier steps)" if step.deferred else ""
        print(f"{i:3d}. [{step.id}] {step.summary}{mark}{later}", file=out)
        if step.before or step.after:
            print(f"       now: {step.before or '?'}  ->  wanted: {step.after or '?'}", file=out)
        for action in step.actions:
            print(f"       $ {action.display()}", file=out)
        if step.note:
            print(f"       note: {step.note}", file=out)
    for skip in plan.skipped:
        print(f"  skip {skip.topic}: {skip.reason}", file=out)
    for note in plan.notes:
        print(f"  note: {note}", file=out)


def _progress(as_json: bool):
    def show(event: str, step, detail: str | None) -> None:
        if event == "start":
            print(f"  ... {step.id}: {step.summary}", file=sys.stderr, flush=True)
        elif event == "done":
            print(f"  ok  {step.id}" + (f": {detail}" if detail else ""), file=sys.stderr, flush=True)
        else:
            print(f"  FAIL {step.id}: {detail}", file=sys.stderr, flush=True)

    return show


def _finish(report, as_json: bool) -> None:
    from belugactl.cli.render import print_json

    if as_json:
        print_json(report.to_dict())
        return
    if report.dry_run:
        render_plan(report.initial)
        return
    if not report.changed:
        what = "nothing to tear down" if report.verb == "teardown" else "no changes"
        print(f"{report.host}: {report.verb}: {what} ({report.duration_s:.2f} s)")
    else:
        print(f"{report.host}: {report.verb}: applied {len(report.applied)} step(s) in {report.duration_s:.2f} s")
        for outcome in report.applied:
            print(f"  {outcome.step.id}: {outcome.step.summary}" + (f" ({outcome.detail})" if outcome.detail else ""))
    for skip in report.initial.skipped:
        print(f"  skip {skip.topic}: {skip.reason}")


def _apply(
    verb: str, file: Path, host_name, root, dry_run, yes, force, as_json, only=None, write_root=False, wait_devices=None
) -> None:
    from belugactl.workflows.setup.wait_devices import checked_seconds, wait_or_fail

    topics = _topics(only)
    wait_s = checked_seconds(wait_devices) if wait_devices is not None else None
    _refuse_writing_root(verb, root, dry_run, write_root)
    with _load(file, host_name, root) as (host, target):
        if wait_s is not None:
            wait_or_fail(host, target.pool, wait_s, say=lambda line: print(line, file=sys.stderr, flush=True))
        _apply_on(verb, host, target, topics, dry_run, yes, force, as_json)


def _apply_on(verb: str, host, target, topics, dry_run, yes, force, as_json) -> None:
    from belugactl.workflows.setup.applier import SetupFailed, run_setup, run_teardown

    run = run_setup if verb == "setup" else run_teardown
    kwargs = {"only": topics} if verb == "setup" else {}
    if force and not dry_run:
        preview = run(host, target, force=True, dry_run=True, **kwargs)
        _confirm(preview.initial, yes, verb)
    try:
        report = run(
            host, target, force=force, dry_run=dry_run, progress=None if as_json else _progress(as_json), **kwargs
        )
    except SetupFailed as exc:
        if as_json:
            from belugactl.cli.render import print_json

            print_json(exc.report.to_dict())
        raise
    _finish(report, as_json)


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        file: Path = file_option(FILE_HELP),
        host: str | None = host_option(HOST_HELP),
        force: bool = typer.Option(False, "--force", help="Plan as `setup --force` would (include destructive steps)."),
        only: str | None = topics_option(f"Comma-separated topics to plan: {TOPICS}."),
        teardown: bool = typer.Option(False, "--teardown", help="Plan a teardown instead."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
        root: Path | None = typer.Option(None, "--root", metavar="DIR|FILE.tar.gz", help=ROOT_HELP),
    ) -> None:
        """Show what setup would change on this host, step by step, with the exact commands.

        Steps marked DESTROYS DATA need `setup --force`. Changes nothing."""
        from belugactl.cli.render import print_json
        from belugactl.workflows.setup.applier import run_setup, run_teardown

        topics = _topics(only)
        with _load(file, host, root) as (h, target):
            if teardown:
                report = run_teardown(h, target, force=force, dry_run=True)
            else:
                report = run_setup(h, target, force=force, dry_run=True, only=topics)
        if as_json:
            print_json(report.initial.to_dict())
        else:
            render_plan(report.initial)

    @app.command("setup")
    def setup_cmd(
        file: Path = file_option(FILE_HELP),
        host: str | None = host_option(HOST_HELP),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the steps; change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before destructive steps (with --force)."),
        force: bool = typer.Option(False, "--force", help="Allow steps that destroy the pool's data."),
        only: str | None = topics_option(f"Comma-separated topics: {TOPICS}."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        root: Path | None = typer.Option(None, "--root", metavar="DIR|FILE.tar.gz", help=ROOT_HELP),
        write_root: bool = typer.Option(False, "--write-root", help=WRITE_ROOT_HELP, hidden=True),
        wait_devices: float | None = typer.Option(
            None,
            "--wait-devices",
            metavar="SECONDS",
            help="First wait up to SECONDS for the manifest's memory devices (by serial) to appear; exit 3 "
            "naming the missing ones (the boot unit uses it: devices can appear after boot).",
        ),
    ) -> None:
        """Make this host match the manifest: CXL auto-online policy, region, devdax, permissions, header,
        hugepages, THP, DDIO, MTRR.

        Idempotent: a converged host reports "no changes". Stops at the first failure and says what was
        done and what was not; rerunning continues from there. One setup per host at a time (lock file)."""
        _apply("setup", file, host, root, dry_run, yes, force, as_json, only, write_root, wait_devices)

    @app.command("teardown")
    def teardown_cmd(
        file: Path = file_option(FILE_HELP),
        host: str | None = host_option(HOST_HELP),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the steps; change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before destructive steps (with --force)."),
        force: bool = typer.Option(False, "--force", help="Allow destroying the namespace and region (pool data)."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        root: Path | None = typer.Option(None, "--root", metavar="DIR|FILE.tar.gz", help=ROOT_HELP),
        write_root: bool = typer.Option(False, "--write-root", help=WRITE_ROOT_HELP, hidden=True),
    ) -> None:
        """Undo what setup made on this host (and only that), newest first.

        Destroying the namespace and region makes the pool's contents unreachable here: needs --force."""
        _apply("teardown", file, host, root, dry_run, yes, force, as_json, write_root=write_root)
