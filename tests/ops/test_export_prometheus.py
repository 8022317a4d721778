"""`belugactl export prometheus`: the scrape config from the manifest, checked by promtool, and the real
Prometheus server scraping a real `belugactl metadata-server` on a file pool with it.

The live test needs the Debian package `prometheus` (scripts/bootstrap installs it): it skips without
it, and fails in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from belugactl.cli.app import run
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.workflows.export_prometheus import scrape_config

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name} is not installed (scripts/bootstrap installs the Debian package prometheus)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus)")
    return found


def _targets(doc: dict) -> dict[str, list[tuple[str, dict]]]:
    return {
        job["job_name"]: [(c["targets"][0], c["labels"]) for c in job["static_configs"]]
        for job in doc["scrape_configs"]
    }


def test_cpu_demo_scrapes_its_server_and_both_instances_on_loopback() -> None:
    doc, warnings = scrape_config(load_manifest(REPO / "examples" / "cpu-demo.yaml"), interval="5s")
    assert warnings == []
    assert doc["global"]["scrape_interval"] == "5s"
    jobs = _targets(doc)
    assert jobs["beluga-metadata"] == [
        ("127.0.0.1:9470", {"rack": "cpu-demo", "host": "cpu-demo", "beluga_instance": "metadata-server"})
    ]
    assert [t for t, _ in jobs["beluga-vllm"]] == ["127.0.0.1:8100", "127.0.0.1:8101"]
    assert [labels["beluga_instance"] for _, labels in jobs["beluga-vllm"]] == ["cpu-demo-vllm-0", "cpu-demo-vllm-1"]
    assert "beluga-router" not in jobs  # no serve.router in the example


def test_a_rack_gets_every_instance_at_its_host_address_and_a_warning_for_loopback_listeners() -> None:
    doc = yaml.safe_load((REPO / "examples" / "beluga-rack.yaml").read_text())
    doc["serve"]["router"] = {"bind": "0.0.0.0"}
    manifest = load_manifest_text(yaml.safe_dump(doc))
    config, warnings = scrape_config(manifest)
    jobs = _targets(config)
    assert len(jobs["beluga-vllm"]) == 128
    assert jobs["beluga-vllm"][9][0] == f"{manifest.hosts[1].address}:8001"
    assert jobs["beluga-vllm"][9][1] == {
        "rack": manifest.name,
        "host": "beluga-01",
        "beluga_instance": "beluga-01-vllm-1",
    }
    # beluga-rack.yaml binds the admin HTTP to loopback: a Prometheus elsewhere cannot reach it; say so.
    assert jobs["beluga-metadata"][0][0] == f"{manifest.host('beluga-00').address}:9470"
    assert len(warnings) == 1 and "metadata server's admin HTTP on beluga-00 binds 127.0.0.1" in warnings[0]
    assert jobs["beluga-router"] == [
        (f"{manifest.host('beluga-00').address}:8404", {"rack": manifest.name, "host": "beluga-00",
                                                        "beluga_instance": "beluga-00-router"})
    ]  # fmt: skip


@pytest.mark.process
def test_cli_writes_a_config_promtool_accepts(tmp_path: Path, capsys) -> None:
    out = tmp_path / "prometheus.yml"
    assert run(["export", "prometheus", "-f", str(REPO / "examples" / "lab.yaml"), "-o", str(out)]) in (0, None)
    assert "wrote" in capsys.readouterr().err
    doc = yaml.safe_load(out.read_text())
    assert {j["job_name"] for j in doc["scrape_configs"]} >= {"beluga-metadata", "beluga-vllm"}
    promtool = _tool("promtool")
    checked = subprocess.run([promtool, "check", "config", str(out)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bad_interval_and_a_manifest_without_serve_are_usage_errors(tmp_path: Path, capsys) -> None:
    demo = str(REPO / "examples" / "cpu-demo.yaml")
    assert run(["export", "prometheus", "-f", demo, "--scrape-interval", "often"]) == 2
    assert "not a duration" in capsys.readouterr().err
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    del doc["serve"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(doc))
    assert run(["export", "prometheus", "-f", str(bare)]) == 2
    err = capsys.readouterr().err
    assert "no serve section" in err and "Traceback" not in err


def test_export_grafana_writes_the_shipped_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "dash.json"
    assert run(["export", "grafana", "-o", str(out)]) in (0, None)
    assert json.loads(out.read_text())["uid"] == "belugactl-rack"


# ---- the real Prometheus against a real metadata server ------------------------------------------------


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, **params: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback test URL
        return json.loads(resp.read())


def start_prometheus(config: Path, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    prometheus = _tool("prometheus")
    port = _free()
    argv = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)  # noqa: S603 - argv list
    return proc, port


def wait_all_up(port: int, expected: int, timeout: float = 60.0) -> list[dict]:
    """Prometheus's active targets once all `expected` of them have been scraped and are up."""
    deadline = time.monotonic() + timeout
    targets: list[dict] = []
    while time.monotonic() < deadline:
        try:
            targets = _api(port, "targets")["data"]["activeTargets"]
        except OSError:
            targets = []
        if len(targets) == expected and all(t["health"] == "up" for t in targets):
            return targets
        time.sleep(0.5)
    pytest.fail(
        f"targets not all up within {timeout:.0f} s: {[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}"
    )


def query(port: int, expr: str) -> list[dict]:
    return _api(port, "query", query=expr)["data"]["result"]


@pytest.mark.process
def test_prometheus_scrapes_a_real_metadata_server_with_the_exported_config(tmp_path: Path) -> None:
    _tool("prometheus")
    doc = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    admin, rpc = _free(), _free()
    doc["serve"]["metadata"].update(admin_port=admin, rpc_port=rpc)
    doc["serve"]["vllm"]["instances_per_host"] = 0  # no vLLM in this test: the server's targets only
    doc["hosts"][0]["instances"] = 0
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    pool = tmp_path / "pool"
    assert run(["pool", "create-file", "-f", str(manifest), str(pool)]) in (0, None)
    config = tmp_path / "prometheus.yml"
    assert run(["export", "prometheus", "-f", str(manifest), "-o", str(config), "--scrape-interval", "1s"]) in (0, None)
    server = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
         "--fence-grace", "0"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "mds.log").open("wb"),
    )  # fmt: skip
    prom, port = start_prometheus(config, tmp_path / "tsdb", tmp_path / "prometheus.log")
    try:
        targets = wait_all_up(port, expected=1)
        assert targets[0]["scrapeUrl"] == f"http://127.0.0.1:{admin}/metrics"
        assert targets[0]["labels"]["beluga_instance"] == "metadata-server"
        deadline = time.monotonic() + 30
        states: dict[str, float] = {}
        while time.monotonic() < deadline and len(states) < 4:
            series = query(port, 'beluga_mds_pool_bytes{rack="cpu-demo"}')
            states = {s["metric"]["state"]: float(s["value"][1]) for s in series}
            time.sleep(0.5)
        assert set(states) == {"used", "free", "reserved", "capacity"}, states
        assert states["capacity"] > 0 and states["used"] + states["free"] == states["capacity"]
        assert query(port, 'beluga_mds_ready{host="cpu-demo"}')[0]["value"][1] == "1"
    finally:
        for proc in (prom, server):
            proc.terminate()
        for proc in (prom, server):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
