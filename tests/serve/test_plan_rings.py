"""serve gives every vLLM process its own CXL-RPC ring (or, where the manifest says so, TCP), and the
manifest is refused when vLLM would run more processes than the layout has rings for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.errors import InputError, ManifestError
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.rack_context import RackContext
from belugactl.workflows.serve import launch_plan
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="vllm", belugactl=("belugactl",), numactl=None)
SINGLE = (REPO / "examples" / "single-host.yaml").read_text()
# single-host, 2 instances of tensor parallelism 2 on its 4 GPUs
TP2 = SINGLE.replace("instances_per_host: 4\n    gpus_per_instance: 1", "instances_per_host: 2\n    gpus_per_instance: 2")  # noqa: E501
ALGO = "    prefix_caching_hash_algo: sha256_cbor"


def _with_extra_args(args: str) -> str:
    return TP2.replace(ALGO, f"{ALGO}\n    extra_args: {args}")


def _plan(text: str, host: str = "gpu-0", pool: str = "/dev/dax0.0"):
    manifest = load_manifest_text(text, file="rack.yaml")
    rack = RackContext(manifest, "rack.yaml", wanted_host=host, pool_option=pool)
    return build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS), manifest


def _extra(proc) -> dict:
    return json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]


def test_every_tensor_parallel_worker_gets_its_own_ring() -> None:
    plan, manifest = _plan(TP2)
    layout = resolve_layout(manifest)
    vllm = [p for p in plan.processes if p.kind == "vllm"]
    assert len(vllm) == 2
    seen: list[str] = []
    for i, proc in enumerate(vllm):
        assert proc.argv[proc.argv.index("--tensor-parallel-size") + 1] == "2"
        extra = _extra(proc)
        rings = layout.rings_of("gpu-0", i)
        assert list(rings) == ["scheduler", "worker0", "worker1"]
        assert extra["transport"] == "cxl"
        assert extra["scheduler_address"] == f"cxl:///dev/dax0.0#{rings['scheduler']}"
        assert extra["worker_addresses"] == {
            "0": f"cxl:///dev/dax0.0#{rings['worker0']}",
            "1": f"cxl:///dev/dax0.0#{rings['worker1']}",
        }
        assert dict(proc.metadata_clients) == {p: f"cxl:///dev/dax0.0#{r}" for p, r in rings.items()}
        assert proc.to_dict()["metadata_clients"]["worker1"] == extra["worker_addresses"]["1"]
        seen += [extra["scheduler_address"], *extra["worker_addresses"].values()]
    assert len(seen) == len(set(seen)) == 6  # no ring handed to two processes
    assert [n for n in plan.notes if "metadata over" in n] == [
        "vllm-0: metadata over CXL-RPC, a ring per process: scheduler ring 0, worker0 ring 1, worker1 ring 2",
        "vllm-1: metadata over CXL-RPC, a ring per process: scheduler ring 3, worker0 ring 4, worker1 ring 5",
    ]


def test_tcp_only_when_the_manifest_chooses_it() -> None:
    rack_tcp = TP2.replace("serve:\n", "serve:\n  metadata: {transport: tcp}\n", 1)
    plan, _ = _plan(rack_tcp)
    for proc in (p for p in plan.processes if p.kind == "vllm"):
        extra = _extra(proc)
        assert extra["transport"] == "tcp" and extra["metadata_address"] == "tcp://127.0.0.1:9471"
        assert "scheduler_address" not in extra and "worker_addresses" not in extra
        tcp = "tcp://127.0.0.1:9471"
        assert dict(proc.metadata_clients) == dict.fromkeys(["scheduler", "worker0", "worker1"], tcp)
    assert any("metadata over TCP (serve.metadata.transport: tcp)" in n for n in plan.notes)
    # per host: only the host that says tcp
    gpus = "    gpus: {count: 4, model: L40S}\n"
    per_host = TP2.replace(gpus, gpus + "    metadata_transport: tcp\n")
    plan, _ = _plan(per_host)
    assert all(_extra(p)["transport"] == "tcp" for p in plan.processes if p.kind == "vllm")
    assert any("(hosts[].metadata_transport: tcp)" in n for n in plan.notes)
    # the default: CXL-RPC, and nothing dials TCP
    plan, _ = _plan(TP2)
    assert all(not any(a.startswith("tcp:") for _, a in p.metadata_clients) for p in plan.processes if p.kind == "vllm")


def test_a_layout_short_of_rings_for_a_process_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The layout and the launch both derive from the manifest; should they ever disagree, no process is
    # handed another's ring (or silently TCP): the plan refuses.
    real = launch_plan.workers_per_instance
    monkeypatch.setattr(launch_plan, "workers_per_instance", lambda m, h: real(m, h) + 1)
    with pytest.raises(InputError, match="no CXL-RPC ring for worker2") as caught:
        _plan(TP2)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("args", "line_of", "message"),
    [
        ('[-tp, "4"]', "-tp", "--tensor-parallel-size 4 would run 4 workers per instance, but the pool layout allots "
         "CXL-RPC rings for 2 on gpu-0"),
        ('["--tensor_parallel_size=1"]', "--tensor_parallel_size=1", "--tensor-parallel-size 1 would run 1 workers"),
        ('[--pipeline-parallel-size, "2"]', "--pipeline-parallel-size", "--pipeline-parallel-size 2 multiplies"),
        ('["--data-parallel-size=2"]', "--data-parallel-size=2", "--data-parallel-size 2 multiplies an instance's "
         "data-parallel engines"),
        ('[-dpl, "2"]', "-dpl", "--data-parallel-size-local 2 multiplies"),
        ('[-pcp, "2"]', "-pcp", "--prefill-context-parallel-size 2 multiplies"),
        ('[-tp, two]', "two", "--tensor-parallel-size needs a positive integer"),
    ],
)
def test_extra_args_that_change_the_process_count_are_refused_at_their_line(args, line_of, message) -> None:
    text = _with_extra_args(args)
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "extra_args:" in t)
    with pytest.raises(ManifestError) as caught:
        load_manifest_text(text, file="rack.yaml")
    (problem,) = caught.value.problems
    assert problem.location.line == line and problem.path.startswith("serve.vllm.extra_args[")
    assert message in problem.message
    assert caught.value.exit_code == 2


def test_extra_args_that_agree_with_the_layout_are_fine() -> None:
    ok = _with_extra_args('[-tp, "2", -pp, "1", "--data-parallel-size=1"]')
    plan, _ = _plan(ok)
    assert len([p for p in plan.processes if p.kind == "vllm"]) == 2


@pytest.mark.process
def test_plan_and_serve_exit_2_naming_file_line_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(_with_extra_args('[--data-parallel-size, "2"]'))
    for argv in (["serve", "-f", str(path), "--dry-run"], ["plan", "-f", str(path), "--host", "gpu-0"]):
        proc = subprocess.run([sys.executable, "-m", "belugactl", *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert f"{path}:" in proc.stderr and "serve.vllm.extra_args[0]" in proc.stderr
        assert "instances_per_host" in proc.stderr and "Traceback" not in proc.stderr
