"""zero_on_free from the manifest (issue 33 item 6): on by default when instances share the pool.

The launch plan passes `--zero-on-free` to the metadata server; the manifest's serve.metadata.zero_on_free
overrides the default either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan

REPO = Path(__file__).resolve().parents[2]
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"  # one host, two vLLM instances on one pool
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl="/usr/bin/numactl")
METADATA_LINE = "  metadata: {admin_bind: 127.0.0.1, admin_port: 9470, rpc_port: 9471, spin_after_ms: 0}"


def _server_argv(manifest: Path) -> tuple[str, ...]:
    rack = load_rack_context(manifest, host="cpu-demo", pool="/tmp/demo.pool")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    return next(p for p in plan.processes if p.name == "metadata-server").argv


def _variant(tmp_path: Path, metadata_extra: str = "", instances: int = 2) -> Path:
    text = CPU_DEMO.read_text()
    assert METADATA_LINE in text and "    instances: 2" in text
    text = text.replace(METADATA_LINE, METADATA_LINE[:-1] + metadata_extra + "}")
    text = text.replace("    instances: 2", f"    instances: {instances}")
    path = tmp_path / "rack.yaml"
    path.write_text(text)
    return path


def test_two_instances_on_one_pool_zero_freed_blocks_by_default():
    assert "--zero-on-free" in _server_argv(CPU_DEMO)


def test_one_instance_does_not_by_default(tmp_path):
    assert "--zero-on-free" not in _server_argv(_variant(tmp_path, instances=1))


@pytest.mark.parametrize(("written", "instances", "expected"), [("false", 2, False), ("true", 1, True)])
def test_the_manifest_setting_wins(tmp_path, written, instances, expected):
    argv = _server_argv(_variant(tmp_path, f", zero_on_free: {written}", instances))
    assert ("--zero-on-free" in argv) is expected


def test_a_non_boolean_is_a_manifest_error(tmp_path, capsys):
    from belugactl.cli.app import run

    manifest = _variant(tmp_path, ", zero_on_free: sometimes")
    assert run(["manifest", "check", "-f", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "zero_on_free" in err and "Traceback" not in err
