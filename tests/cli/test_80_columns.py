"""Text at 80 columns: doctor's reasons and fixes wrap with a hanging indent and a fix's commands
stand one a line; the layout table keeps every column; piped output has no trailing padding."""

from __future__ import annotations

import re

import pytest

from belugactl.cli.doctor_cmd import fix_lines
from belugactl.cli.render import shell_lines
from tests.support.fixture_trees import tree
from tests.support.manifests import EXAMPLES

AT_80 = {"COLUMNS": "80"}
PIPED = {"COLUMNS": None}  # no width given: a pipe or a file
RACK = str(EXAMPLES / "beluga-rack.yaml")
LAYOUT_HEADERS = ("region", "offset", "end", "size", "owner", "detail")


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _fits(text: str, width: int = 80) -> None:
    for line in _lines(text):
        # A word is never split (a path keeps its characters), so a line holding one word alone may be longer:
        # how long depends on where the checkout lives, not on the wrapping.
        assert len(line) <= width or len(line.split()) == 1, line
        assert line == line.rstrip(), f"trailing spaces: {line!r}"


def _doctor(cli, env):  # type: ignore[no-untyped-def]
    result = cli("doctor", "--root", str(tree("beluga-intel")), "-f", RACK, "--host", "beluga-00", env=env)
    assert result.code == 1, result.stderr
    return result.stdout


@pytest.mark.parametrize("env", [AT_80, PIPED], ids=["COLUMNS=80", "piped"])
def test_doctor_fits_80_columns_and_pads_nothing(cli, env) -> None:
    _fits(_doctor(cli, env))


@pytest.mark.parametrize("fixture", ["nocxl", "amd-host", "lab-guest"])
def test_doctor_fits_80_columns_on_other_hosts(cli, fixture) -> None:
    result = cli("doctor", "--root", str(tree(fixture)), "-v", env=AT_80)
    assert result.stdout.startswith("belugactl doctor on "), result.stderr
    _fits(result.stdout)


def test_the_ddio_fix_is_one_setpci_command_a_line(cli) -> None:
    out = _doctor(cli, AT_80)
    commands = [line.strip() for line in _lines(out) if line.strip().startswith("setpci ")]
    assert len(commands) == 16
    bdfs = re.findall(r"(0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9]) \(0x180=", out)
    assert len(bdfs) == 8
    assert commands == [c for bdf in bdfs for c in (f"setpci -s {bdf} 180.b=00:88", f"setpci -s {bdf} 185.b=01:01")]


def test_a_fix_wraps_under_itself(cli) -> None:
    lines = _lines(_doctor(cli, AT_80))
    start = next(i for i, line in enumerate(lines) if line.startswith("      fix: Sapphire Rapids:"))
    # the prose continues under the text after "fix: ", not at the left margin
    assert lines[start + 1].startswith(" " * 11) and lines[start + 1][11] != " "


def test_a_long_reason_wraps_under_the_reason_column(cli) -> None:
    lines = _lines(_doctor(cli, AT_80))
    at = next(i for i, line in enumerate(lines) if "[✗] ddio.disabled" in line)
    column = lines[at].index("DDIO is on")
    assert lines[at + 1][:column].strip() == "" and lines[at + 1][column] != " "


def test_a_command_longer_than_the_line_continues_with_a_backslash() -> None:
    command = "echo 16384 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
    lines = shell_lines(command, 80, indent=13)
    assert len(lines) == 2 and lines[0].endswith(" \\")
    assert all(len(line) <= 80 for line in lines)
    assert " ".join(line.strip().removesuffix(" \\") for line in lines) == command  # pasted, the same command


def test_a_quoted_argument_is_never_broken() -> None:
    fix = 'as root: echo "base=0x10000000000 size=0x8000000000 type=uncachable" > /proc/mtrr (lost at reboot)'
    lines = fix_lines(fix, 60)
    quoted = [line for line in lines if '"base=' in line]
    assert len(quoted) == 1 and quoted[0].count('"') == 2


@pytest.mark.parametrize("argv", [["pool", "show", "-f", RACK], ["manifest", "check", "-f", RACK]])
@pytest.mark.parametrize("env", [AT_80, PIPED], ids=["COLUMNS=80", "piped"])
def test_the_layout_table_keeps_every_column(cli, argv, env) -> None:
    result = cli(*argv, env=env)
    assert result.code == 0, result.stderr
    header = next(line for line in _lines(result.stdout) if line.split()[:2] == ["region", "offset"])
    assert header.split() == list(LAYOUT_HEADERS)
    assert "0x7fffe000000" in result.stdout and "0x80000000000" in result.stdout  # addresses stay whole
    if env is AT_80:
        _fits(result.stdout)
    else:
        for line in _lines(result.stdout):
            assert line == line.rstrip(), f"trailing spaces: {line!r}"
