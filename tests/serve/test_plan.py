"""The serve plan: exact argv and environment from the manifest (and discovery for NUMA placement)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.errors import InputError
from belugactl.host.host import Host
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.discover import discover
from belugactl.workflows.rack_context import RackContext, load_rack_context
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl="/usr/bin/numactl")


def _plan(manifest_file: Path, host: str, *, snapshot=None, tools: Tools = TOOLS, pool: str = "/dev/dax0.0"):
    rack = load_rack_context(manifest_file, host=host, pool=pool)
    return build_serve_plan(rack, run_dir="/run/beluga", tools=tools, snapshot=snapshot)


def _kv_config(argv: tuple[str, ...]) -> dict:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_cpu_demo_runs_the_server_then_two_pinned_instances() -> None:
    plan = _plan(REPO / "examples" / "cpu-demo.yaml", "cpu-demo", pool="/tmp/demo.pool")
    names = [p.name for p in plan.processes]
    assert names == ["metadata-server", "vllm-0", "vllm-1"]
    server = plan.processes[0]
    assert server.argv[:2] == ("/opt/bin/belugactl", "metadata-server")
    assert server.argv[server.argv.index("--pool") + 1] == "/tmp/demo.pool"
    assert server.health_url == "http://127.0.0.1:9470/readyz"

    for i, proc in enumerate(plan.processes[1:]):
        argv = proc.argv
        assert argv[:2] == ("/opt/vllm/bin/vllm", "serve")
        assert argv[2] == str(REPO / "examples" / "models" / "llama-cpu-demo")  # relative to the manifest
        assert argv[argv.index("--port") + 1] == str(8100 + i)
        assert argv[argv.index("--block-size") + 1] == "32"  # CPU platform: a multiple of 32
        assert argv[argv.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
        assert "--load-format=dummy" in argv and "--no-enable-prefix-caching" in argv
        assert proc.env["PYTHONHASHSEED"] == "0"
        assert proc.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert "CUDA_VISIBLE_DEVICES" not in proc.env
        assert proc.health_url == f"http://127.0.0.1:{8100 + i}/health"
        kv = _kv_config(argv)
        assert kv["kv_connector"] == "BelugaConnector"
        assert kv["kv_role"] == "kv_both" and kv["kv_load_failure_policy"] == "recompute"
        extra = kv["kv_connector_extra_config"]
        assert extra["pool_path"] == "/tmp/demo.pool"
        assert extra["metadata_address"] == "tcp://127.0.0.1:9471"
        # every process its own ring: the scheduler's, then the worker's (one on a CPU host)
        assert extra["transport"] == "cxl"
        assert extra["scheduler_address"] == f"cxl:///tmp/demo.pool#{2 * i}"
        assert extra["worker_addresses"] == {"0": f"cxl:///tmp/demo.pool#{2 * i + 1}"}
        assert dict(proc.metadata_clients) == {
            "scheduler": f"cxl:///tmp/demo.pool#{2 * i}",
            "worker0": f"cxl:///tmp/demo.pool#{2 * i + 1}",
        }
        assert extra["namespace"] == "cpu-demo" and extra["hash_seed"] == "0"
        assert extra["stats_path"] == f"/run/beluga/stats/vllm-{i}"
        assert extra["coherence"] == "none"  # one host: no cross-host flushes needed
        assert extra["layerwise_loads"] == "auto"  # the connector decides by the KV tensors' device


def test_gpu_host_gets_its_gpus_and_the_nearest_numa_node() -> None:
    snapshot = discover(Host.from_tree(REPO / "tests" / "fixtures" / "beluga-intel"))
    plan = _plan(REPO / "examples" / "beluga-rack.yaml", "beluga-01", snapshot=snapshot)
    vllm = [p for p in plan.processes if p.kind == "vllm"]
    assert [p.name for p in plan.processes] == [f"vllm-{i}" for i in range(8)]  # no server on this host
    for i, proc in enumerate(vllm):
        node = 0 if i < 4 else 1  # GPUs 0-3 sit under socket 0 in the fixture, 4-7 under socket 1
        assert proc.env["CUDA_VISIBLE_DEVICES"] == str(i)
        assert proc.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # indexes in PCI order, as discovery lists GPUs
        assert proc.argv[:3] == ("/usr/bin/numactl", f"--cpunodebind={node}", f"--membind={node}")
        assert proc.argv[proc.argv.index("--block-size") + 1] == "16"
        assert proc.argv[-2:] == ("--gpu-memory-utilization", "0.92")
        extra = _kv_config(proc.argv)["kv_connector_extra_config"]
        assert extra["metadata_address"] == "tcp://10.10.0.11:9471"  # the metadata host's address
        assert extra["coherence"] == "none"  # the rack maps its pool uncachable (MTRR): plain copies are coherent
    assert plan.metadata_admin_url is None


def test_without_discovery_or_numactl_the_plan_says_so() -> None:
    tools = Tools(vllm="vllm", belugactl=("belugactl",), numactl=None)
    snapshot = discover(Host.from_tree(REPO / "tests" / "fixtures" / "beluga-intel"))
    plan = _plan(REPO / "examples" / "beluga-rack.yaml", "beluga-01", snapshot=snapshot, tools=tools)
    assert plan.processes[0].argv[0] == "vllm"
    assert any("numactl is not installed" in n for n in plan.notes)
    plan = _plan(REPO / "examples" / "beluga-rack.yaml", "beluga-01", snapshot=None)
    assert any("NUMA nodes unknown" in n for n in plan.notes)


def test_a_write_back_pool_shared_by_hosts_needs_flushing_copies() -> None:
    text = (REPO / "examples" / "beluga-rack.yaml").read_text().replace("uncachable", "write-back")
    manifest = load_manifest_text(text, file="rack.yaml")
    rack = RackContext(manifest, "rack.yaml", wanted_host="beluga-02", pool_option="/dev/dax0.0")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    assert {_kv_config(p.argv)["kv_connector_extra_config"]["coherence"] for p in plan.processes} == {"flush"}


def test_a_manifest_without_serve_section_is_refused(tmp_path: Path) -> None:
    text = (REPO / "examples" / "single-host.yaml").read_text().split("\nserve:")[0]
    manifest = load_manifest_text(text, file="rack.yaml")
    with pytest.raises(InputError, match="no serve section"):
        rack = RackContext(manifest, "rack.yaml", wanted_host="gpu-0", pool_option="/dev/dax0.0")
        build_serve_plan(rack, run_dir=tmp_path, tools=TOOLS)


def test_remote_workers_need_a_reachable_rpc_listener(tmp_path: Path) -> None:
    # beluga-rack binds the RPC listener on beluga-00's rack address: other hosts may start
    assert _plan(REPO / "examples" / "beluga-rack.yaml", "beluga-01").blockers == []
    server = _plan(REPO / "examples" / "beluga-rack.yaml", "beluga-00")
    argv = next(p.argv for p in server.processes if p.kind == "metadata")
    assert argv[argv.index("--rpc-bind") + 1] == "10.10.0.11"
    # the lab keeps the default loopback bind: over CXL-RPC (the default) nobody dials it, so lab-2 starts
    assert _plan(REPO / "examples" / "lab.yaml", "lab-2").blockers == []
    # on the explicit TCP fallback lab-2's workers could never reach lab-1's server
    tcp = tmp_path / "lab-tcp.yaml"
    lab = (REPO / "examples" / "lab.yaml").read_text()
    tcp.write_text(lab.replace("serve:\n  metadata:\n", "serve:\n  metadata:\n    transport: tcp\n"))
    blocked = _plan(tcp, "lab-2")
    assert len(blocked.blockers) == 1 and "rpc_bind" in blocked.blockers[0]
    assert _plan(tcp, "lab-1").blockers == []


@pytest.mark.parametrize(("mode", "sent"), [("true", True), ("off", False), ("auto", "auto")])
def test_the_manifest_picks_how_pool_hits_are_copied(tmp_path: Path, mode: str, sent: object) -> None:
    text = (REPO / "examples" / "cpu-demo.yaml").read_text().replace(
        "    gpus_per_instance: 0\n", f"    gpus_per_instance: 0\n    layerwise_loads: {mode}\n"
    )
    manifest = load_manifest_text(text, file=str(REPO / "examples" / "cpu-demo.yaml"))
    rack = RackContext(manifest, str(REPO / "examples" / "cpu-demo.yaml"), wanted_host="cpu-demo", pool_option="/p")
    plan = build_serve_plan(rack, run_dir=tmp_path, tools=TOOLS)
    modes = {_kv_config(p.argv)["kv_connector_extra_config"]["layerwise_loads"] for p in plan.processes[1:]}
    assert modes == {sent}


def test_a_layerwise_loads_that_is_no_mode_is_refused_with_its_line() -> None:
    text = (REPO / "examples" / "cpu-demo.yaml").read_text()
    text = text.replace("    gpus_per_instance: 0\n", "    gpus_per_instance: 0\n    layerwise_loads: yes-please\n")
    line = text.splitlines().index("    layerwise_loads: yes-please") + 1
    with pytest.raises(InputError) as caught:
        load_manifest_text(text, file="rack.yaml")
    problems = "\n".join(str(p) for p in caught.value.problems)  # type: ignore[attr-defined]
    assert f"rack.yaml:{line}:" in problems and "serve.vllm.layerwise_loads" in problems and "'auto'" in problems


@pytest.mark.parametrize("policy", [None, "journal", "start-empty"])
def test_the_manifest_can_name_the_metadata_servers_restart_policy(tmp_path: Path, policy: str | None) -> None:
    """serve.metadata.restart_policy reaches the server's argv; unset, the server picks (journal on a
    device pool, start-empty on a file pool)."""
    text = (REPO / "examples" / "cpu-demo.yaml").read_text()
    if policy is not None:
        text = text.replace("spin_after_ms: 0}", f"spin_after_ms: 0, restart_policy: {policy}}}")
    manifest = load_manifest_text(text, file=str(REPO / "examples" / "cpu-demo.yaml"))
    rack = RackContext(manifest, str(REPO / "examples" / "cpu-demo.yaml"), wanted_host="cpu-demo", pool_option="/p")
    argv = build_serve_plan(rack, run_dir=tmp_path, tools=TOOLS).processes[0].argv
    if policy is None:
        assert "--restart-policy" not in argv
    else:
        assert argv[argv.index("--restart-policy") + 1] == policy


def test_start_empty_with_an_etcd_standby_is_refused_at_its_line() -> None:
    from belugactl.errors import ManifestError

    text = (REPO / "examples" / "cpu-demo.yaml").read_text().replace(
        "spin_after_ms: 0}",
        "spin_after_ms: 0, restart_policy: start-empty,\n"
        "             etcd: {endpoints: ['http://127.0.0.1:2379'], candidates: [cpu-demo]}}",
    )
    with pytest.raises(ManifestError) as bad:
        load_manifest_text(text, file="rack.yaml")
    why = str(bad.value.why)
    assert "serve.metadata.restart_policy" in why and "a standby takes over with the index the journal keeps" in why
