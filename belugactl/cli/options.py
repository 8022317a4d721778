"""Options several commands share, spelled once: `-f/--file`, `--json`, `--host`, `--ignore`.

Each returns a fresh `typer.Option` (Typer reads it as the parameter's default). Every option that
takes a value names it with a metavar that says what it is (PATH, URL, HOST, N, SECONDS...):
tests/cli/test_readme_agrees.py walks the command tree and fails on Typer's `<str>` defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import typer

from belugactl.cli.completion import complete_check, complete_host, complete_topic

FILE_HELP = "The rack manifest (YAML)."
# Every `-f` reads it when the flag is absent (documented in README.md and docs/manifest.md).
MANIFEST_ENVVAR = "BELUGA_MANIFEST"
JSON_HELP = "Print a JSON document on stdout."
HOST_HELP = "This machine's host in the manifest (default: the one matching the hostname)."
IGNORE_HELP = "Downgrade this doctor check's failure (repeat, or a comma list; `all`). See `belugactl doctor --list`."


def file_option(help: str = FILE_HELP, *, required: bool = True) -> Any:
    """`-f/--file FILE`, the rack manifest; $BELUGA_MANIFEST when the flag is absent."""
    return typer.Option(
        ... if required else None,
        "-f",
        "--file",
        metavar="FILE",
        help=help,
        envvar=MANIFEST_ENVVAR,
        show_envvar=True,
        show_default=False,
    )


def json_option(help: str = JSON_HELP) -> Any:
    return typer.Option(False, "--json", help=help)


def host_option(help: str = HOST_HELP) -> Any:
    return typer.Option(None, "--host", metavar="NAME", help=help, autocompletion=complete_host)


def ignore_option(help: str = IGNORE_HELP) -> Any:
    return typer.Option([], "--ignore", metavar="CHECK", help=help, autocompletion=complete_check)


def hidden_alias(*names: str, default: Any = None) -> Any:
    """An old spelling kept working but out of --help (e.g. `doctor --manifest`, `serve --ignore-check`)."""
    return typer.Option(default, *names, hidden=True)


def warn_deprecated(old: str, new: str, why: str) -> None:
    """One stderr line for a deprecated spelling that still works (kept for one release)."""
    import sys

    print(f"belugactl: warning: {old} is deprecated ({why}); use {new}", file=sys.stderr)


def topics_option(help: str) -> Any:
    return typer.Option(None, "--only", metavar="TOPICS", help=help, autocompletion=complete_topic)


def checked_ignores(*values: Iterable[str] | None) -> frozenset[str]:
    """`--ignore` values as known check ids: an unknown id is exit 2 with a did-you-mean."""
    from belugactl.workflows.doctor import builtin_registry, validate_ignores

    return validate_ignores(builtin_registry(), [v for group in values if group for v in group])
