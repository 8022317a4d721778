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


def test_host_completion_loads_through_the_rack_context_loader_and_prints_nothing(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    from belugactl.cli import completion
    from belugactl.workflows import rack_context as rack_mod

    seen: list[str] = []
    real = rack_mod.load_rack_context

    def spy(file, **kwargs):
        seen.append(str(file))
        return real(file, **kwargs)

    monkeypatch.setattr(rack_mod, "load_rack_context", spy)
    assert completion.complete_host(SimpleNamespace(params={"file": str(LAB)}), "lab-") == ["lab-1", "lab-2"]
    assert seen == [str(LAB)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [")
    missing = tmp_path / "none.yaml"
    for file in (bad, missing):
        assert completion.complete_host(SimpleNamespace(params={"manifest": str(file)}), "") == []
    assert capsys.readouterr() == ("", "")


def test_a_broken_manifest_writes_nothing_to_stderr_either(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\npool: {size: lots}\n")
    env = {"_BELUGACTL_COMPLETE": "complete_bash", "COMP_WORDS": f"belugactl plan -f {bad} --host ", "COMP_CWORD": "5"}
    result = cli(env=env)
    assert result.code == 0 and result.stdout.split() == [] and result.stderr == ""
