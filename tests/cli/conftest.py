"""CLI tests run in-process: Typer's CliRunner on the real app, errors mapped as `belugactl` maps them."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from belugactl.cli.app import build_app
from belugactl.errors import BelugaError


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str  # with a BelugaError's what / why / fix, as `belugactl` prints them


def invoke(*args: str, env: dict[str, str] | None = None) -> CliResult:
    result = CliRunner().invoke(build_app(), list(args), prog_name="belugactl", env=env)
    exc = result.exception
    err = result.stderr
    code = result.exit_code
    if isinstance(exc, BelugaError):
        code = int(exc.exit_code)
        err += "\n".join(x for x in (exc.what, exc.why, exc.fix) if x)
    elif exc is not None and not isinstance(exc, SystemExit):
        raise exc
    return CliResult(code, result.stdout, err)


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    return invoke


@pytest.fixture
def model_calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts manifest parses (the one loader's parser) and layout resolutions outside that loader.

    The loader itself resolves the layout once to validate that it fits; that call is counted
    apart ("layout in the loader"), so a test can pin how often commands resolve it again.
    """
    import belugactl.model.layout as layout_mod
    import belugactl.model.manifest as manifest_mod

    counts: collections.Counter[str] = collections.Counter()
    depth = [0]
    parse, resolve = manifest_mod.load_manifest_text, layout_mod.resolve_layout

    def counted_parse(*a, **k):  # type: ignore[no-untyped-def]
        counts["manifest parses"] += 1
        depth[0] += 1
        try:
            return parse(*a, **k)
        finally:
            depth[0] -= 1

    def counted_resolve(*a, **k):  # type: ignore[no-untyped-def]
        counts["layout in the loader" if depth[0] else "layout resolutions"] += 1
        return resolve(*a, **k)

    monkeypatch.setattr(manifest_mod, "load_manifest_text", counted_parse)
    monkeypatch.setattr(layout_mod, "resolve_layout", counted_resolve)
    return counts
