"""`belugactl manifest check` and `belugactl pool show`: exit codes, JSON, SVG, no tracebacks."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from belugactl.cli.app import run
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from tests.support.manifests import BROKEN, EXAMPLES

SVG_NS = "{http://www.w3.org/2000/svg}"


def test_manifest_check_ok(capsys):
    assert run(["manifest", "check", "-f", str(EXAMPLES / "lab.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "lab-1" in out and "lab-2" in out


def test_manifest_check_json(capsys):
    path = EXAMPLES / "beluga-rack.yaml"
    assert run(["manifest", "check", "-f", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    assert doc["layout"]["layout_hash"] == resolve_layout(load_manifest(path)).layout_hash
    assert len(doc["manifest"]["hosts"]) == 16


def test_manifest_check_broken_exits_2_with_positions(capsys):
    path = BROKEN / "several-problems.yaml"
    assert run(["manifest", "check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5:11: pool.source.kind" in err
    assert f"{path}:11:15: hosts[0].platform" in err
    assert "Traceback" not in err


def test_manifest_check_broken_json_lists_problems_on_stdout(capsys):
    path = BROKEN / "duplicate-key.yaml"
    assert run(["manifest", "check", "-f", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["ok"] is False
    assert (doc["problems"][0]["line"], doc["problems"][0]["column"]) == (8, 3)
    assert "duplicate key" in captured.err


@pytest.mark.process
def test_real_process_exit_code_and_no_traceback():
    # The installed entry point, as an operator runs it.
    proc = subprocess.run(
        [sys.executable, "-m", "belugactl", "manifest", "check", "-f", str(BROKEN / "tab-indent.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "tab-indent.yaml:15:1" in proc.stderr
    assert proc.stdout == ""


def test_missing_file_exits_2(tmp_path, capsys):
    assert run(["manifest", "check", "-f", str(tmp_path / "none.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_pool_show_table(capsys):
    assert run(["pool", "show", "-f", str(EXAMPLES / "beluga-rack.yaml")]) == 0
    out = capsys.readouterr().out
    for i in range(16):
        assert f"beluga-{i:02d}" in out
    assert "shared-kv" in out


def test_pool_show_json_matches_the_layout(capsys):
    path = EXAMPLES / "lab.yaml"
    assert run(["pool", "show", "-f", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    layout = resolve_layout(load_manifest(path))
    assert doc["rack"] == "lab"
    assert doc["layout_hash"] == layout.layout_hash
    assert [(p["host"], p["offset"], p["size"]) for p in doc["partitions"]] == [
        (p.host, p.offset, p.size) for p in layout.partitions
    ]


def test_pool_show_lists_who_owns_which_ring(capsys):
    assert run(["pool", "show", "-f", str(EXAMPLES / "beluga-rack.yaml")]) == 0
    out = capsys.readouterr().out
    assert "CXL-RPC rings (one per vLLM process)" in out
    rows = [line.split() for line in out.splitlines() if "scheduler:" in line]
    assert len(rows) == 16 * 8  # one row per instance: its scheduler's and its worker's ring
    assert rows[0][:3] == ["0-1", "beluga-00", "vllm-0"] and "scheduler: 0, worker0: 1" in out
    assert rows[-1][:3] == ["254-255", "beluga-15", "vllm-7"] and "scheduler: 254, worker0: 255" in out
    assert "256-271" in out and "spare (16)" in out


def test_pool_show_json_lists_ring_owners(capsys):
    assert run(["pool", "show", "-f", str(EXAMPLES / "cpu-demo.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clients"] == [
        {"host": "cpu-demo", "instance": i, "process": p, "ring": 2 * i + (p == "worker0")}
        for i in (0, 1) for p in ("scheduler", "worker0")
    ]  # fmt: skip
    assert doc["spare_rings"] == [4, 5] and doc["rpc"]["ring_count"] == 6


@pytest.mark.parametrize("name", ["lab.yaml", "beluga-rack.yaml", "single-host.yaml"])
def test_pool_show_svg_parses_and_names_every_host(tmp_path, capsys, name):
    svg = tmp_path / "pool.svg"
    path = EXAMPLES / name
    assert run(["pool", "show", "-f", str(path), "--svg", str(svg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["svg"] == str(svg)
    root = ET.parse(svg).getroot()
    assert root.tag == f"{SVG_NS}svg"
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG_NS}text"))
    for host in load_manifest(path).host_names():
        assert host in texts


def test_pool_show_svg_in_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    target = tmp_path / "no-such-dir" / "pool.svg"
    assert run(["pool", "show", "-f", str(EXAMPLES / "lab.yaml"), "--svg", str(target)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not target.parent.exists()


def test_pool_show_broken_manifest_exits_2(capsys):
    assert run(["pool", "show", "-f", str(BROKEN / "layout-does-not-fit.yaml")]) == 2
    assert "layout.shared_kv" in capsys.readouterr().err


def test_manifest_schema_describes_every_top_level_key(capsys):
    from belugactl.model.manifest_schema import Manifest

    assert run(["manifest", "schema"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["properties"]) == set(Manifest.model_fields)
    assert doc["$defs"]["Pool"]["additionalProperties"] is False  # unknown keys are errors in editors too
    size_types = {alt["type"] for alt in doc["$defs"]["Pool"]["properties"]["size"]["anyOf"]}
    assert size_types == {"integer", "string"}  # "2MiB" must not be flagged by an editor
