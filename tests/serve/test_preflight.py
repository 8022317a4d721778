"""`serve` refuses clearly before starting anything: exit 3 for what the machine lacks, 2 for bad input."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
import yaml

from belugactl.cli.app import run
from belugactl.errors import StepFailed
from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.doctor.result import CheckOutcome, CheckResult, DoctorReport
from belugactl.workflows.serve.preflight import check_doctor

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo(tmp_path: Path) -> dict[str, Path]:
    """cpu-demo with free ports and an absolute model path, a fake `vllm` program, and a file pool."""
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    doc["serve"]["metadata"].update(admin_port=_free_port(), rpc_port=_free_port())
    doc["serve"]["vllm"]["port_base"] = _free_port()
    doc["serve"]["vllm"]["instances_per_host"] = 1
    doc["hosts"][0]["instances"] = 1
    doc["serve"]["vllm"]["model"] = str(REPO / "examples" / "models" / "llama-cpu-demo")
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    vllm = tmp_path / "bin" / "vllm"
    vllm.parent.mkdir()
    vllm.write_text("#!/bin/sh\nexit 0\n")
    vllm.chmod(vllm.stat().st_mode | stat.S_IXUSR)
    pool = tmp_path / "pool"
    create_file_pool(pool, manifest)
    return {"manifest": manifest, "vllm": vllm, "pool": pool, "run": tmp_path / "run", "doc": doc}  # type: ignore[dict-item]


def _serve(demo: dict, *extra: str, pool: Path | None = None, vllm: str | None = None) -> list[str]:
    return [
        "serve", "-f", str(demo["manifest"]), "--pool", str(pool or demo["pool"]), "--run-dir", str(demo["run"]),
        "--vllm", vllm or str(demo["vllm"]), *extra,
    ]  # fmt: skip


def test_missing_vllm_is_an_environment_error(demo, capsys) -> None:
    assert run(_serve(demo, vllm="/nonexistent/vllm")) == 3
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "scripts/bootstrap-vllm" in err
    assert "Traceback" not in err
    assert not (demo["run"] / "state.json").exists()


def test_a_model_path_that_does_not_exist_is_bad_input(demo, capsys) -> None:
    doc = demo["doc"]
    doc["serve"]["vllm"]["model"] = "/nonexistent/model"
    demo["manifest"].write_text(yaml.safe_dump(doc))
    assert run(_serve(demo)) == 2
    assert "model /nonexistent/model does not exist" in capsys.readouterr().err


def test_a_port_in_use_is_named(demo, capsys) -> None:
    port = demo["doc"]["serve"]["vllm"]["port_base"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert run(_serve(demo)) == 3
    err = capsys.readouterr().err
    assert f"port in use: {port} (vllm-0)" in err


def test_an_unprovisioned_pool_is_an_environment_error(demo, capsys) -> None:
    assert run(_serve(demo, pool=demo["pool"].with_name("missing.pool"))) == 3
    err = capsys.readouterr().err
    assert "is not provisioned" in err and "--create-pool" in err


def test_a_pool_made_for_another_manifest_is_refused(demo, tmp_path, capsys) -> None:
    other = tmp_path / "other.pool"
    create_file_pool(other, REPO / "examples" / "lab.yaml")
    assert run(_serve(demo, pool=other)) == 2
    assert "error:" in capsys.readouterr().err


def test_dry_run_prints_exact_commands_and_starts_nothing(demo, capsys) -> None:
    assert run([*_serve(demo, "--dry-run", "--json")]) == 0
    plan = json.loads(capsys.readouterr().out)
    vllm = [p for p in plan["processes"] if p["kind"] == "vllm"]
    assert vllm[0]["argv"][:2] == [str(demo["vllm"]), "serve"]
    assert vllm[0]["env"]["PYTHONHASHSEED"] == "0"
    assert not demo["run"].exists()
    assert run([*_serve(demo, "--dry-run")]) == 0
    text = capsys.readouterr().out
    assert "env PYTHONHASHSEED=0" in text and "--kv-transfer-config" in text


def _result(check: str, status: str) -> CheckResult:
    if status == "fail":
        return CheckResult.fail(f"{check} is fail", fix="do it")
    return CheckResult.ok(f"{check} is ok")


def _report(*outcomes: tuple[str, str]) -> DoctorReport:
    return DoctorReport(
        hostname="h",
        host_entry="h",
        manifest="rack.yaml",
        outcomes=tuple(CheckOutcome(id=i, title=i, topic=i.split(".")[0], result=_result(i, s)) for i, s in outcomes),
    )


def test_doctor_failures_that_break_serving_block_unless_ignored() -> None:
    report = _report(("dax.align", "fail"), ("thp.mode", "fail"), ("numa.cxl-node-cpuless", "ok"))
    with pytest.raises(StepFailed, match="1 failure that would break serving: dax.align") as info:
        check_doctor(report)
    assert "dax.align is fail (fix: do it)" in (info.value.why or "")
    assert check_doctor(report, ignore=["dax.align"]) == ["dax.align"]
    assert check_doctor(_report(("thp.mode", "fail"))) == []


def test_status_and_stop_without_a_serve(tmp_path, capsys) -> None:
    assert run(["status", "--run-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "not started"
    # Nothing running is not an error for either command: both exit 0 and say so.
    assert run(["stop", "--run-dir", str(tmp_path)]) == 0
    assert "nothing is running" in capsys.readouterr().out
    assert run(["status", "--run-dir", str(tmp_path)]) == 0
    assert "nothing is running" in capsys.readouterr().out
    assert run(["stop", "--run-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nothing_running"] is True
    assert os.listdir(tmp_path) == []


def test_ports_are_checked_on_the_address_each_listener_binds() -> None:
    """A port taken on 127.0.0.2 is free on 127.0.0.1 and the other way round: two hosts' listeners
    on one machine (one at each address) take the same port; a wildcard bind dials loopback."""
    from belugactl.errors import EnvironmentProblem
    from belugactl.workflows.serve.preflight import check_ports, listen_address

    assert listen_address("http://127.0.0.2:8404/healthz") == "127.0.0.2"
    assert listen_address("http://127.0.0.1:9470/readyz") == "127.0.0.1"
    assert listen_address("http://[::1]:9470/readyz") == "127.0.0.1"  # v6: checked on loopback as before
    assert listen_address(None) == listen_address("http://gpu-0:80/") == "127.0.0.1"
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        port = held.getsockname()[1]
        check_ports([("vllm-0", port, "127.0.0.1")])  # the other address: free
        with pytest.raises(EnvironmentProblem, match=f"port in use: {port} \\(vllm-0\\)"):
            check_ports([("vllm-0", port, "127.0.0.2")])
