"""`--json` always prints one JSON document on stdout, errors included, and every document carries
`schema_version` (docs/json.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from belugactl.cli.app import build_app, run
from tests.support.manifests import BROKEN

# The schema version docs/json.md documents; belugactl.cli.render.SCHEMA_VERSION is the code's.
SCHEMA_VERSION = 1

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
EXAMPLES = REPO / "examples"


def json_commands() -> list[str]:
    """Every command (as its words, `pool show`) that takes --json, from the CLI itself."""
    found: list[str] = []

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if isinstance(subcommands, dict):
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
            return
        if any("--json" in getattr(p, "opts", ()) for p in getattr(command, "params", ())):
            found.append(" ".join(path))

    walk(typer.main.get_command(build_app()), [])
    return sorted(found)


def _document(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict, str]:
    code = run(argv)
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one document and nothing else on stdout
    assert isinstance(doc, dict), out
    return code, doc, err


# The documents this walk reads: every --json command that runs here, without hardware, a lab or a
# running serve. (status/stop/lab status read this machine's run dirs; rack, bench and the servers
# need hosts or start processes: their usage-error documents are checked below for every command.)
def _success_cases(tmp: Path) -> list[tuple[list[str], int]]:
    pool, demo, lab = str(tmp / "pool"), str(EXAMPLES / "cpu-demo.yaml"), str(EXAMPLES / "lab.yaml")
    return [
        (["discover", "--json", "--root", str(FIXTURES / "beluga-intel")], 0),
        (["doctor", "--json", "--root", str(FIXTURES / "beluga-intel")], 1),
        (["doctor", "--list", "--json"], 0),
        (["manifest", "check", "-f", demo, "--json"], 0),
        (["pool", "show", "-f", demo, "--json"], 0),
        (["pool", "create-file", pool, "-f", demo, "--json"], 0),
        (["pool", "inspect", pool, "-f", demo, "--json"], 0),
        (["plan", "-f", lab, "--host", "lab-1", "--root", str(FIXTURES / "lab-guest"), "--json"], 0),
        (["serve", "-f", demo, "--dry-run", "--json"], 0),
    ]


def test_every_document_a_command_prints_carries_schema_version(capsys, tmp_path):
    for argv, code in _success_cases(tmp_path):
        got, doc, _err = _document(capsys, argv)
        assert got == code, (argv, doc)
        assert doc["schema_version"] == SCHEMA_VERSION, argv
        assert list(doc)[0] == "schema_version", argv


@pytest.mark.parametrize("command", json_commands())
def test_a_usage_error_with_json_is_a_json_error_document(capsys, command):
    code, doc, err = _document(capsys, [*command.split(), "--json", "--no-such-flag"])
    assert code == 2
    assert doc["schema_version"] == SCHEMA_VERSION and doc["ok"] is False
    error = doc["error"]
    assert error["code"] == 2 and error["kind"] == "usage"
    assert "--no-such-flag" in error["message"] and error["hint"] == f"belugactl {command} --help"
    assert "No such option" in err  # the human message stays on stderr


def test_the_walk_found_the_commands_the_issue_names():
    found = json_commands()
    for command in ("discover", "doctor", "manifest check", "pool show", "pool inspect", "plan", "setup", "serve"):
        assert command in found


def test_an_operator_error_with_json_is_a_json_error_document(capsys, tmp_path):
    code, doc, err = _document(capsys, ["doctor", "--root", str(tmp_path / "missing"), "--json"])
    assert code == 2
    assert doc["ok"] is False and doc["schema_version"] == SCHEMA_VERSION
    assert doc["error"]["code"] == 2 and doc["error"]["kind"] == "UsageError"
    assert "no such file or directory" in doc["error"]["message"]
    assert doc["error"]["hint"]  # the fix, as the human error gives it
    assert "no such file or directory" in err


def test_a_broken_manifest_with_json_is_one_document_with_its_problems(capsys):
    broken = BROKEN / "duplicate-key.yaml"
    code, doc, _err = _document(capsys, ["manifest", "check", "-f", str(broken), "--json"])
    assert code == 2
    assert doc["ok"] is False and doc["error"]["kind"] == "ManifestError" and doc["error"]["code"] == 2
    assert doc["error"]["where"] == f"{broken}:8:3"
    assert (doc["problems"][0]["line"], doc["problems"][0]["column"]) == (8, 3) and doc["file"] == str(broken)


def test_without_json_stdout_stays_empty_on_error(capsys, tmp_path):
    assert run(["doctor", "--root", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().out == ""
