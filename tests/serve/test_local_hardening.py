"""Issue 30's local findings for serve: vLLM's listen address, the run dir, and whom `stop` signals."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.control import prepare
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan
from belugactl.workflows.serve.preflight import exposure_warnings
from tests.support.small_rack import SMALL_RACK

REPO = Path(__file__).resolve().parents[2]
TOOLS = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl=None)
RACK = REPO / "examples" / "beluga-rack.yaml"


def _vllm(manifest: Path, host: str):
    rack = load_rack_context(manifest, host=host, pool="/dev/dax0.0")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=TOOLS)
    return [p for p in plan.processes if p.kind == "vllm"]


def _host_arg(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--host"]


# ---- vLLM's listen address (item 6) ---------------------------------------------------------------


def _rack_with(tmp_path: Path, old: str = "", new: str = "", *, base: str = SMALL_RACK) -> Path:
    assert old in base
    path = tmp_path / "rack.yaml"
    path.write_text(base.replace(old, new, 1) if old else base)
    return path


def test_vllm_listens_on_loopback_by_default(tmp_path: Path) -> None:
    path = _rack_with(tmp_path)
    procs = _vllm(path, "h1")
    assert procs and all(_host_arg(p.argv) == ["127.0.0.1"] for p in procs)
    assert all(p.health_url.startswith("http://127.0.0.1:") for p in procs)  # type: ignore[union-attr]
    assert exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0")) == []


def test_with_a_router_vllm_listens_where_the_router_dials_it_and_serve_warns(tmp_path: Path) -> None:
    path = _rack_with(tmp_path, "serve:\n", "serve:\n  router: {bind: 127.0.0.1}\n")
    procs = _vllm(path, "h1")
    assert procs and all(_host_arg(p.argv) == ["10.0.0.2"] for p in procs)
    assert all(p.health_url.startswith("http://10.0.0.2:") for p in procs)  # type: ignore[union-attr]
    warnings = exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0"))
    assert warnings == [
        "WARNING: vLLM listens on 10.0.0.2 (hosts[].address of h1 (serve.router)), beyond loopback: anyone who "
        "reaches it can use the model's API without a credential; firewall it to the router's hosts"
    ]


def test_an_operators_host_in_extra_args_is_kept_and_every_address_is_warned_about(tmp_path: Path) -> None:
    path = _rack_with(
        tmp_path, "    instances_per_host: 2\n", "    instances_per_host: 2\n    extra_args: [--host=0.0.0.0]\n"
    )
    procs = _vllm(path, "h1")
    assert procs and all("--host" not in p.argv and "--host=0.0.0.0" in p.argv for p in procs)
    warnings = exposure_warnings(load_rack_context(path, host="h1", pool="/dev/dax0.0"))
    assert len(warnings) == 1 and "vLLM listens on every address (serve.vllm.extra_args --host)" in warnings[0]


def test_the_cpu_demo_serves_on_loopback_without_a_warning(tmp_path: Path) -> None:
    rack = load_rack_context(REPO / "examples" / "cpu-demo.yaml", pool=str(tmp_path / "p.pool"))
    plan = prepare(rack, run_dir=str(tmp_path / "run"), vllm="/opt/vllm/bin/vllm", check=False).plan
    assert not any("WARNING" in n for n in plan.notes), plan.notes
    vllm = [p for p in plan.processes if p.kind == "vllm"]
    assert vllm and all(_host_arg(p.argv) == [] and "--host=127.0.0.1" in p.argv for p in vllm)


def test_a_dry_run_shows_the_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "examples" / "cpu-demo.yaml").read_text().replace("--host=127.0.0.1", "--host=0.0.0.0")
    path = tmp_path / "demo.yaml"
    path.write_text(text.replace("model: ./", f"model: {REPO / 'examples'}/"))
    assert run(["serve", "-f", str(path), "--pool", str(tmp_path / "p.pool"), "--dry-run"]) in (0, None)
    assert "# note: WARNING: vLLM listens on every address" in capsys.readouterr().out


def test_a_metadata_listener_beyond_loopback_is_warned_about() -> None:
    rack = load_rack_context(RACK, host="beluga-00", pool="/dev/dax0.0")
    assert any("rpc_bind is 10.10.0.11, beyond loopback" in w for w in exposure_warnings(rack))
