"""One rule for "which manifest host is this machine", the same in every command (issue 10 part 2).

Before, doctor matched short names and setup did not: a manifest entry `lab-1.rack` on a machine
named `lab-1` was found by doctor while setup exited 2.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from belugactl.errors import ExitCode, UsageError
from belugactl.model.host_select import select_host
from belugactl.model.manifest import load_manifest_text
from tests.support.paths import LAB, LAB_GUEST


def _fqdn_lab(tmp_path: Path) -> Path:
    """The lab manifest with fully qualified host names (lab-1.rack, lab-2.rack)."""
    text = re.sub(r"\b(lab-[12])\b", r"\1.rack", LAB.read_text())
    path = tmp_path / "fqdn.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--root", str(LAB_GUEST), "--json"],
        ["setup", "--dry-run", "--root", str(LAB_GUEST), "--json"],
        ["doctor", "--json"],
        ["export", "systemd"],
    ],
    ids=["plan", "setup", "doctor", "export"],
)
def test_a_short_hostname_finds_the_full_entry_in_every_command(argv, cli, tmp_path, monkeypatch):
    manifest = _fqdn_lab(tmp_path)
    monkeypatch.setattr(socket, "gethostname", lambda: "lab-2")
    if argv[0] == "doctor":
        # doctor reads the hostname from the host it checks: a tree whose hostname is lab-2
        tree = tmp_path / "tree"
        (tree / "proc/sys/kernel").mkdir(parents=True)
        (tree / "proc/sys/kernel/hostname").write_text("lab-2\n")
        argv = [*argv, "--root", str(tree)]
    result = cli(*argv, "-f", str(manifest))
    assert result.code in (0, 1), result.stderr  # doctor on an empty tree fails checks, not the host
    assert "lab-2.rack" in result.stdout


def test_the_rule_exact_short_and_ambiguous():
    text = re.sub(r"\blab-([12])\b", lambda m: "gpu01." + "ab"[int(m[1]) - 1], LAB.read_text())
    manifest = load_manifest_text(text, file="rack.yaml")
    assert select_host(manifest, "gpu01.b", None).name == "gpu01.b"  # exact
    assert select_host(manifest, None, "gpu01.a.example.org").name == "gpu01.a"  # exact short name of a FQDN
    with pytest.raises(UsageError, match="matches several hosts") as info:
        select_host(manifest, None, "gpu01")
    assert "gpu01.a, gpu01.b" in info.value.what and info.value.exit_code == ExitCode.USAGE


def test_unknown_host_names_get_a_did_you_mean_and_the_list(cli):
    result = cli("plan", "-f", str(LAB), "--host", "lab-3", "--root", str(LAB_GUEST))
    assert result.code == ExitCode.USAGE
    assert "no host named 'lab-3'" in result.stderr
    assert "did you mean --host lab-" in result.stderr and "or --host lab-" in result.stderr
    assert "hosts in the manifest: lab-1, lab-2" in result.stderr


def test_an_unknown_hostname_is_exit_2_everywhere(cli, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "lab-x")
    for argv in (["plan", "--root", str(LAB_GUEST)], ["export", "systemd"], ["serve", "--dry-run"]):
        result = cli(*argv, "-f", str(LAB))
        assert result.code == ExitCode.USAGE, (argv, result.stderr)
        assert "this machine (lab-x) is not one of the hosts" in result.stderr
        assert "pass --host NAME" in result.stderr
