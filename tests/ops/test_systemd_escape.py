"""`export systemd` escapes what systemd would otherwise expand or split: `%` (specifiers), `$`
(environment variables) and spaces in paths, per systemd.service(5) and systemd.unit(5)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.errors import InputError
from belugactl.workflows.setup.systemd import exec_line, exec_word, serve_unit_text, unit_text

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"
ODD = "rack %h $HOME ${USER}"  # a directory name systemd would expand twice over, and split


def _directive(text: str, key: str) -> str:
    return next(line.partition("=")[2] for line in text.splitlines() if line.startswith(f"{key}="))


def test_exec_words_double_percent_and_dollar_and_quote_spaces() -> None:
    assert exec_word("/usr/bin/python3") == "/usr/bin/python3"
    assert exec_word("/srv/a b/rack.yaml") == '"/srv/a b/rack.yaml"'
    assert exec_word("/srv/50%/$X") == '"/srv/50%%/$$X"'
    assert exec_word('say "hi" \\ there') == '"say \\"hi\\" \\\\ there"'
    # a first word starting with an ExecStart prefix is quoted, so '-' does not mean "ignore failure"
    assert exec_line(["-x", "-y"]) == '"-x" -y'


def test_units_escape_a_manifest_path_with_percent_dollar_and_space() -> None:
    path = f"/etc/belugactl/{ODD}/rack.yaml"
    for text in (unit_text(path, "h0", ["/usr/bin/belugactl"]), serve_unit_text(path, "h0", ["/usr/bin/belugactl"])):
        assert '-f "/etc/belugactl/rack %%h $$HOME $${USER}/rack.yaml"' in _directive(text, "ExecStart")
        assert _directive(text, "ConditionPathExists") == "/etc/belugactl/rack %%h $HOME ${USER}/rack.yaml"


def test_a_newline_in_a_path_is_refused_not_written() -> None:
    with pytest.raises(InputError, match="control character"):
        serve_unit_text("/etc/x\nExecStartPre=/bin/sh -c evil/rack.yaml", "h0", ["/usr/bin/belugactl"])


@pytest.mark.process
def test_systemd_analyze_verify_accepts_units_for_such_a_path(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the text is checked by the tests above)")
    rack = tmp_path / ODD / "rack.yaml"
    rack.parent.mkdir()
    rack.write_text(LAB.read_text())
    out = tmp_path / "units"
    out.mkdir()
    code = run(["export", "systemd", "-f", str(rack), "--host", "lab-1", "-o", str(out),
                "--command", f"{sys.executable} -m belugactl"])  # fmt: skip
    assert code in (0, None)
    serve = (out / "belugactl-serve.service").read_text()
    assert "%%h $$HOME" in _directive(serve, "ExecStart")
    files = [str(out / "belugactl-setup.service"), str(out / "belugactl-serve.service")]
    checked = subprocess.run([analyze, "verify", *files], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and checked.stderr.strip() == "", checked.stderr
