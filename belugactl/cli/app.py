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
    resident belugactl builds it once and reuses it in every forked child)."""
    from belugactl.errors import BelugaError, ExitCode

    cli = command if command is not None else build_app()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli(args=args, prog_name="belugactl", standalone_mode=False)
    except BelugaError as exc:
        from belugactl.cli.render import print_error

        print_error(exc)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except typer.Abort:
        print("\ninterrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except Exception as exc:  # click's own usage errors arrive here with standalone_mode=False
        handled = _click_exception_code(exc)
        if handled is None:
            raise
        return handled
    if isinstance(result, int):
        return result
    return int(ExitCode.OK)


def _click_exception_code(exc: Exception) -> int | None:
    show = getattr(exc, "show", None)
    code = getattr(exc, "exit_code", None)
    if callable(show) and isinstance(code, int):
        show()
        return code
    return None
