"""The CLI's single error mapping: exit codes and no tracebacks."""

import subprocess
import sys

import pytest

from belugactl.cli import app as app_module
from belugactl.errors import EnvironmentProblem, ExitCode, InputError, UsageError


def _belugactl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_version():
    proc = _belugactl("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("belugactl ")


@pytest.mark.process
def test_help_lists_commands():
    proc = _belugactl("--help")
    assert proc.returncode == 0
    assert "Usage: belugactl" in proc.stdout


@pytest.mark.process
def test_unknown_command_is_usage_error():
    proc = _belugactl("no-such-command")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UsageError("bad flag", fix="use --host"), ExitCode.USAGE),
        (InputError("bad bytes"), ExitCode.USAGE),
        (EnvironmentProblem("no ndctl", fix="apt-get install ndctl"), ExitCode.ENVIRONMENT),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED),
    ],
)
def test_errors_map_to_exit_codes(monkeypatch, capsys, exc, code):
    import typer

    def build():
        app = typer.Typer()

        @app.command()
        def boom() -> None:
            raise exc

        @app.command()
        def other() -> None:
            pass

        return app

    monkeypatch.setattr(app_module, "build_app", build)
    assert app_module.run(["boom"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if hasattr(exc, "fix") and exc.fix:
        assert exc.fix in err


HEAVY = ("pydantic", "yaml", "rich.console", "psutil", "prometheus_client", "numpy", "torch")


@pytest.mark.process
def test_help_starts_fast():
    # A guard against an eager heavy import creeping into the start path: what `belugactl --help`
    # itself imports, and what building the app imports (a wall-clock bound only followed the load).
    run_help = (
        "import runpy, sys\n"
        "sys.argv = ['belugactl', '--help']\n"
        "try:\n"
        "    runpy.run_module('belugactl', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    code = e.code or 0\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY:' + ','.join(heavy), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", run_help], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: belugactl" in proc.stdout
    assert "HEAVY:\n" in proc.stderr, f"heavy modules imported by --help: {proc.stderr.strip()[-300:]}"
    check = subprocess.run(
        [sys.executable, "-c", "import sys, belugactl.cli.app as a; a.build_app(); "
         f"heavy = [m for m in {HEAVY!r}"
         " if m in sys.modules]; print(','.join(heavy))"],
        capture_output=True, text=True, timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "", f"heavy modules imported at start: {check.stdout.strip()}"


@pytest.mark.process
def test_every_command_has_an_example_in_its_help():
    from belugactl.cli.examples import attach

    app = app_module.build_app()
    assert attach(app) == []  # build_app attached them all: nothing left without one
    proc = _belugactl("rack", "doctor", "--help")
    assert "Example:" in proc.stdout and "belugactl rack doctor -f" in proc.stdout
