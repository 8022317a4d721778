"""Shell completion for host names (from the -f manifest), doctor check ids and setup topics (issue 15)."""

from __future__ import annotations

import pytest

from belugactl.cli.completion import setup_topic_ids
from tests.support.paths import LAB


def _complete(cli, words: str) -> list[str]:
    """What bash completion offers for the last word of `words` (Typer's completion protocol)."""
    parts = words.split(" ")
    env = {"_BELUGACTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    result = cli(env=env)
    assert result.code == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("command", ["doctor", "plan", "setup", "serve", "export systemd", "metadata-server"])
def test_host_names_come_from_the_manifest_given(command, cli):
    assert _complete(cli, f"belugactl {command} -f {LAB} --host ") == ["lab-1", "lab-2"]
    assert _complete(cli, f"belugactl {command} -f {LAB} --host lab-2") == ["lab-2"]


def test_no_manifest_or_a_broken_one_completes_nothing_quietly(cli, tmp_path):
    assert _complete(cli, "belugactl plan --host ") == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [")
    assert _complete(cli, f"belugactl plan -f {bad} --host ") == []


@pytest.mark.parametrize("command", ["doctor", "serve", "rack doctor"])
def test_check_ids(command, cli):
    offered = _complete(cli, f"belugactl {command} --ignore dax.al")
    assert offered == ["dax.align"]
    assert "dax.align,numa.cxl-node-cpuless" in _complete(cli, f"belugactl {command} --ignore dax.align,numa.")


def test_setup_topics_complete_the_last_item_of_a_comma_list(cli):
    assert _complete(cli, "belugactl setup --only hu") == ["hugepages"]
    assert _complete(cli, "belugactl plan --only region,h") == ["region,header", "region,hugepages"]
    assert set(setup_topic_ids()) >= {"region", "devdax", "header", "hugepages", "thp", "ddio", "mtrr"}
