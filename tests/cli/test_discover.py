"""`belugactl discover` through the CLI entry point: fixtures, bundles, and this very machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.cli.app import run
from tests.support.fixture_trees import snapshot, tree, without_root


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict, str]:
    code = run(argv)
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_json_on_beluga_intel(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = _json(capsys, ["discover", "--json", "--root", str(tree("beluga-intel"))])
    assert code == 0 and err == ""
    assert list(doc) == [
        "schema_version", "hostname", "root", "tools", "cxl", "nd", "dax", "numa", "thp", "memory", "pci",
        "root_ports", "cpu", "kernel", "mtrr", "udev_db", "problems", "hugepages", "topics_skipped",
    ]
    assert doc["dax"][0]["mode"] == "system-ram"
    assert doc["cxl"]["regions"][0]["memdevs"] == ["mem0", "mem1"]
    assert doc["numa"][2]["cpus"] == [] and doc["numa"][2]["has_memory"] is True
    assert doc["root_ports"][0]["perfctrlsts_0"] == 0x80
    assert doc["numa"][0]["hugepages"]["2097152"]["total"] == 4096  # JSON keys are strings
    assert doc["cpu"]["flags"] == sorted(doc["cpu"]["flags"])
    assert doc["memory"]["auto_online_blocks"] == "online_movable"
    expected = {"schema_version": 1, **json.loads(json.dumps(snapshot("beluga-intel").to_dict()))}
    assert without_root(doc) == without_root(expected)
    assert doc["topics_skipped"] == []  # a full discovery


@pytest.mark.process
def test_json_on_this_machine_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _err = _json(capsys, ["discover", "--json"])
    assert code == 0
    assert doc["root"] == "/"
    assert isinstance(doc["problems"], list)
    assert doc["kernel"]["release"]  # every Linux machine has one
    assert doc["numa"] or any("node" in p for p in doc["problems"])


@pytest.mark.process
def test_human_output_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["discover"]) == 0
    out = capsys.readouterr().out
    assert "Tools" in out and "NUMA nodes" in out


def test_human_output_names_the_facts(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["discover", "--root", str(tree("beluga-intel"))]) == 0
    out = capsys.readouterr().out
    assert "beluga-gpu-03" in out
    assert "system-ram" in out
    assert "0000:ab:00.0" in out  # no emoji substitution of ":ab:"
    assert "online_movable" in out
    assert "none (memory only)" in out


def test_human_output_says_there_is_no_cxl(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["discover", "--root", str(tree("nocxl"))]) == 0
    out = capsys.readouterr().out
    assert "CXL: none on this host" in out
    assert "not readable" in out


def test_capture_then_root(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bundle = tmp_path / "support.tar.gz"
    code = run(["discover", "--root", str(tree("lab-guest")), "--capture", str(bundle), "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "captured" in err and str(bundle) in err
    first = json.loads(out)
    code, again, _ = _json(capsys, ["discover", "--json", "--root", str(bundle)])
    assert code == 0
    assert without_root(again) == without_root(first)


def test_missing_root_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(["discover", "--root", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "Traceback" not in err


def test_root_names_the_bundle_not_its_unpacked_copy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    assert run(["discover", "--root", str(tree("nocxl")), "--capture", str(bundle)]) == 0
    capsys.readouterr()
    code, doc, _ = _json(capsys, ["discover", "--json", "--root", str(bundle)])
    assert code == 0 and doc["root"] == str(bundle)
