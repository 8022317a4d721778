"""The `belugactl` entry point.

Command modules only import typer and the standard library at module level; everything heavy
(pydantic, rich, yaml, the workflows) is imported inside the command functions, so that
`belugactl --help` stays fast. `main()` is the one place that maps errors to exit codes.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import typer

from belugactl import __version__

# Each module exposes `register(app: typer.Typer) -> None`. Order is the order of `--help`.
COMMAND_MODULES: tuple[str, ...] = (
    "belugactl.cli.discover_cmd",
    "belugactl.cli.doctor_cmd",
    "belugactl.cli.manifest_cmd",
    "belugactl.cli.setup_cmd",
    "belugactl.cli.pool_cmd",
    "belugactl.cli.serve_cmd",
    "belugactl.cli.metadata_server_cmd",
    "belugactl.cli.pd_proxy_cmd",
    "belugactl.cli.bench_cmd",
    "belugactl.cli.lab_cmd",
    "belugactl.cli.rack_cmd",
    "belugactl.cli.top_cmd",
    "belugactl.cli.export_cmd",
)

HELP = """Operate a Beluga-style rack: GPU servers sharing one CXL memory pool as a KV-cache tier.

Typical flow on a host:  discover -> doctor -f rack.yaml -> plan/setup -f rack.yaml -> serve -f rack.yaml

Try it without hardware:  belugactl lab up && belugactl lab exec lab-1 -- belugactl doctor
"""


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"belugactl {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="belugactl",
        help=HELP,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """belugactl"""

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    from belugactl.cli.examples import attach

    attach(app)
    return app


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and exit with) the process exit code."""
    code = run(argv)
    sys.exit(code)


def run(argv: list[str] | None = None, *, command: Callable[..., Any] | None = None) -> int:
    """Run one command line. `command`: a click command built earlier from `build_app()` (the lab's
    resident belugactl builds it once and reuses it in every forked child).

    With --json, stdout always holds one JSON document: the command's, or, when it fails before
    printing one, {"ok": false, "error": {...}} (the human error still goes to stderr)."""
    from belugactl.cli import render
    from belugactl.errors import BelugaError, ExitCode, clear_interrupt_notes

    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    render.reset_json_printed()
    clear_interrupt_notes()
    cli: Any = command
    try:
        if cli is None:  # inside the try: a Ctrl-C while the commands import is an interrupt too
            cli = typer.main.get_command(build_app())
        result = cli(args=args, prog_name="belugactl", standalone_mode=False)
    except BelugaError as exc:
        render.print_error(exc)
        if as_json and not render.json_printed():
            render.print_json(render.error_document_for(exc))
        return int(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        return _interrupted(cli, args, as_json)
    except typer.Exit as exc:
        result = exc.exit_code
    except Exception as exc:  # click's own usage errors arrive here with standalone_mode=False
        handled = _click_exception_code(exc)
        if handled is None:
            raise
        if as_json and not render.json_printed():
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            render.print_json(
                render.error_document(
                    handled,
                    "usage",
                    message,
                    hint=f"{command_name(cli, args)} --help",
                    where=_usage_where(exc),
                )
            )
        return handled
    # click (standalone_mode=False) returns typer.Exit's code; typer turns Ctrl-C into a silent Exit(130)
    code = result if isinstance(result, int) else int(ExitCode.OK)
    if code == ExitCode.INTERRUPTED:
        return _interrupted(cli, args, as_json)
    if code != 0 and as_json and not render.json_printed():
        name = command_name(cli, args)
        render.print_json(render.error_document(code, "failed", f"{name} exited with code {code}", hint="see stderr"))
    return code


def wants_json(args: list[str]) -> bool:
    """--json among the options (not after `--`, where the words belong to another program)."""
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head


def command_name(cli: Any, args: list[str]) -> str:
    return " ".join(_command_path(cli, args))


def _command_path(cli: Any, args: list[str]) -> list[str]:
    """`belugactl pool show` from the words of the command line that name (sub)commands."""
    path = ["belugactl"]
    group = cli
    for word in args:
        if word.startswith("-"):
            continue
        commands = getattr(group, "commands", None)
        if not isinstance(commands, dict) or word not in commands:
            break
        path.append(word)
        group = commands[word]
    return path


# Commands that change nothing on the host: an interrupt leaves nothing to clean up.
READ_ONLY_COMMANDS = frozenset({
    "discover", "doctor", "plan", "status", "manifest check", "manifest schema", "pool show", "pool inspect",
})  # fmt: skip


def _interrupted(cli: Any, args: list[str], as_json: bool) -> int:
    """Ctrl-C: exit 130 with one line naming the command and, where it said so, what it left behind."""
    from belugactl.cli import render
    from belugactl.errors import ExitCode, current_interrupt_note

    name = command_name(cli, args)
    state = current_interrupt_note()
    if state is None and name.removeprefix("belugactl ") in READ_ONLY_COMMANDS:
        state = "it only reads, nothing was changed"
    line = f"interrupted: {name}" + (f"; {state}" if state else "")
    print(f"\n{line}", file=sys.stderr, flush=True)
    if as_json and not render.json_printed():
        render.print_json(
            render.error_document(int(ExitCode.INTERRUPTED), "interrupted", line.removeprefix("interrupted: "))
        )
    return int(ExitCode.INTERRUPTED)


def _usage_where(exc: Exception) -> str | None:
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None)
    return opts[-1] if opts else None


def _click_exception_code(exc: Exception) -> int | None:
    show = getattr(exc, "show", None)
    code = getattr(exc, "exit_code", None)
    if callable(show) and isinstance(code, int):
        show()
        return code
    return None
