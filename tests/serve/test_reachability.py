"""Every instance dials the metadata server where its listener really answers; serve refuses otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.rack_context import RackContext
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="vllm", belugactl=("belugactl",), numactl=None)
RACK = (REPO / "examples" / "beluga-rack.yaml").read_text()
LAB = (REPO / "examples" / "lab.yaml").read_text()


def _with_bind(text: str, bind: str) -> str:
    if "rpc_bind:" in text:
        lines = [
            f"    rpc_bind: {bind}" if line.strip().startswith("rpc_bind:") else line for line in text.splitlines()
        ]
        return "\n".join(lines) + "\n"
    return text.replace("  metadata:\n", f"  metadata:\n    rpc_bind: {bind}\n", 1)


def _tcp(text: str) -> str:
    """The rack with every host on the explicit TCP fallback (serve.metadata.transport: tcp)."""
    assert "serve:\n  metadata:\n" in text
    return text.replace("serve:\n  metadata:\n", "serve:\n  metadata:\n    transport: tcp\n", 1)


def _plan(text: str, host: str):
    manifest = load_manifest_text(text, file="rack.yaml")
    rack = RackContext(manifest, "rack.yaml", wanted_host=host, pool_option="/dev/dax0.0")
    return build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)


def _dials(plan) -> set[str]:
    out = set()
    for proc in plan.processes:
        if proc.kind == "vllm":
            kv = json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])
            out.add(kv["kv_connector_extra_config"]["metadata_address"])
    return out


def test_the_metadata_hosts_own_instances_dial_a_specific_bind_not_loopback():
    # The example binds beluga-00's rack address: its eight instances used to dial 127.0.0.1 and never saved.
    plan = _plan(RACK, "beluga-00")
    assert plan.blockers == []
    assert _dials(plan) == {"tcp://10.10.0.11:9471"}
    assert len([p for p in plan.processes if p.kind == "vllm"]) == 8
    assert _dials(_plan(RACK, "beluga-07")) == {"tcp://10.10.0.11:9471"}


def test_a_wildcard_bind_is_loopback_at_home_and_the_host_address_elsewhere():
    text = _with_bind(RACK, "0.0.0.0")
    assert _dials(_plan(text, "beluga-00")) == {"tcp://127.0.0.1:9471"}
    assert _dials(_plan(text, "beluga-03")) == {"tcp://10.10.0.11:9471"}
    v6 = _with_bind(RACK, '"::"')
    assert _dials(_plan(v6, "beluga-00")) == {"tcp://[::1]:9471"}


def test_a_loopback_bind_blocks_every_tcp_instance_elsewhere_and_names_them():
    text = _tcp(_with_bind(RACK, "127.0.0.1"))
    assert _plan(text, "beluga-00").blockers == []
    assert _dials(_plan(text, "beluga-00")) == {"tcp://127.0.0.1:9471"}
    home = _plan(text, "beluga-00")
    assert sum("cannot reach this metadata server" in n for n in home.notes) == 15  # the other hosts, said at home
    (blocker,) = _plan(text, "beluga-05").blockers
    assert blocker.startswith("beluga-05 vllm-0, vllm-1, vllm-2, vllm-3, vllm-4, vllm-5, vllm-6, vllm-7: ")
    assert "loopback only on beluga-00" in blocker and "fix: set serve.metadata.rpc_bind to 10.10.0.11" in blocker


def test_a_host_without_instances_is_not_blocked():
    entry = "  - name: beluga-05\n    address: 10.10.0.16\n"
    text = _tcp(_with_bind(RACK, "127.0.0.1")).replace(entry, entry + "    instances: 0\n")
    assert _plan(text, "beluga-05").blockers == []


def test_over_cxl_rpc_a_loopback_bind_blocks_nobody():
    # Every process talks over its own ring in the pool: the TCP listener's bind does not matter.
    text = _with_bind(RACK, "127.0.0.1")
    home = _plan(text, "beluga-00")
    assert home.blockers == [] and not any("cannot reach" in n for n in home.notes)
    remote = _plan(text, "beluga-05")
    assert remote.blockers == []
    assert all(p.metadata_clients and all(a.startswith("cxl://") for _, a in p.metadata_clients)
               for p in remote.processes if p.kind == "vllm")  # fmt: skip


def test_one_host_on_tcp_is_blocked_alone_and_the_rest_stay_on_rings():
    entry = "  - name: beluga-05\n    address: 10.10.0.16\n"
    text = _with_bind(RACK, "127.0.0.1").replace(entry, entry + "    metadata_transport: tcp\n")
    (blocker,) = _plan(text, "beluga-05").blockers
    assert "rpc_bind" in blocker
    assert _plan(text, "beluga-06").blockers == []
    home = _plan(text, "beluga-00")
    assert [n for n in home.notes if "cannot reach" in n] == [
        n for n in home.notes if n.startswith("beluga-05's vLLM instances cannot reach")
    ] != []


def _lab_on_tcp(tmp_path: Path) -> Path:
    path = tmp_path / "lab-tcp.yaml"
    path.write_text(_tcp(LAB))
    return path


@pytest.mark.process
def test_serve_refuses_with_exit_2_naming_the_instances(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "belugactl", "serve", "-f", str(_lab_on_tcp(tmp_path)), "--host", "lab-2",
         "--pool", str(tmp_path / "p.pool"), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "lab-2 vllm-0" in proc.stderr and "rpc_bind" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.process
@pytest.mark.parametrize("host", ["lab-1", "lab-2"])
def test_dry_run_still_prints_a_blocked_plan(host, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "belugactl", "serve", "-f", str(_lab_on_tcp(tmp_path)), "--host", host,
         "--pool", "/dev/dax0.0", "--dry-run"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("WILL NOT START" in proc.stdout) == (host == "lab-2")
