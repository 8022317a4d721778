"""The one place the CLI loads a manifest: every command that takes `-f` builds its rack context here."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext


def rack_context(
    file: str | Path, *, host: str | None = None, pool: str | None = None, as_json: bool = False
) -> RackContext:
    """Load the manifest once for this command. With --json, a ManifestError's problems reach stdout
    as the command's document through the CLI's error handler (`belugactl.cli.app.run`)."""
    from belugactl.workflows.rack_context import load_rack_context

    del as_json  # kept for callers; the error handler knows --json from the command line
    return load_rack_context(file, host=host, pool=pool)


def rack_context_quietly(file: str | Path) -> RackContext | None:
    """The rack context for shell completion: None on any problem, and nothing ever printed.

    A completer runs inside the user's shell as they type; a manifest that is half-written, missing
    or broken must complete nothing rather than write an error (or a warning) into their prompt."""
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return rack_context(file)
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return None
