"""One spelling per flag (issue 10 part 5): `-f/--file` and `--ignore` everywhere, ids validated everywhere.

The old spellings (`doctor --manifest`, `serve --ignore-check`) still work but are out of --help.
"""

from __future__ import annotations

import pytest

from belugactl.errors import ExitCode
from tests.support.paths import CPU_DEMO, LAB, LAB_GUEST


@pytest.mark.parametrize("flag", ["-f", "--file", "--manifest"])
def test_doctor_takes_the_manifest_as_every_other_command(flag, cli):
    result = cli("doctor", flag, str(LAB), "--root", str(LAB_GUEST), "--json")
    assert result.code in (0, 1), result.stderr
    assert '"host_entry": "lab-1"' in result.stdout


@pytest.mark.parametrize(
    "command", [["doctor"], ["plan"], ["setup"], ["teardown"], ["serve"], ["pool", "show"], ["metadata-server"],
                ["export", "systemd"], ["rack", "doctor"], ["manifest", "check"]],
)
def test_help_shows_one_spelling(command, cli):
    text = cli(*command, "--help").stdout
    assert "-f, --file" in text
    assert "--manifest" not in text.replace("--remote-manifest", "")
    assert "--ignore-check" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--ignore", "dax.algn"],
        ["serve", "-f", str(CPU_DEMO), "--dry-run", "--ignore", "dax.algn"],
        ["serve", "-f", str(CPU_DEMO), "--dry-run", "--ignore-check", "dax.algn"],  # the old spelling, validated
        ["rack", "doctor", "-f", str(LAB), "--transport", "local", "--ignore", "dax.algn"],
    ],
    ids=["doctor", "serve", "serve-old-spelling", "rack-doctor"],
)
def test_unknown_check_ids_are_exit_2_with_did_you_mean(argv, cli):
    result = cli(*argv)
    assert result.code == ExitCode.USAGE, result.stderr
    assert "--ignore dax.algn: no check has that id; did you mean dax.align?" in result.stderr


def test_serve_accepts_known_ids_in_either_spelling(cli, tmp_path):
    for flag in ("--ignore", "--ignore-check"):
        result = cli("serve", "-f", str(CPU_DEMO), "--pool", str(tmp_path / "p"), "--dry-run", flag, "dax.align,all")
        assert result.code == 0, result.stderr


def test_setup_topics_are_validated_with_did_you_mean(cli):
    result = cli("plan", "-f", str(LAB), "--host", "lab-1", "--root", str(LAB_GUEST), "--only", "hugepage")
    assert result.code == ExitCode.USAGE
    assert "unknown topic(s) for --only: hugepage; did you mean hugepages?" in result.stderr
