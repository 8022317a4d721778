"""`belugactl doctor --perf` from the command line: the manifest's pool measured once (the measuring
function swapped for a fixture document), judged against `pool.expect`; nothing measured without
--perf, on a capture (--root) or without a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.workflows.doctor.checks import perf
from tests.doctor.test_perf_checks import IDS, measured
from tests.support.paths import CPU_DEMO, LAB, LAB_GUEST


def test_doctor_perf_measures_the_manifests_pool_once_and_judges_it(tmp_path: Path, monkeypatch):
    """The CLI's probe (the pool by the rack context's rule) through run_doctor, on a snapshot built in
    code (a live doctor run would start discovery's processes)."""
    from belugactl.cli.doctor_cmd import perf_probe
    from belugactl.cli.load_rack import rack_context
    from belugactl.host.host import Host
    from belugactl.workflows.doctor import run_doctor
    from tests.support.doctor_snapshots import beluga_like

    text = CPU_DEMO.read_text().replace(
        "  align: 2MiB\n", "  align: 2MiB\n  expect: {load_latency_ns: 750, read_gbps_per_device: 22.5}\n", 1
    )
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(text)
    pools = []

    def fake(path: str, loaded: object) -> dict:
        pools.append((path, loaded.pool.expect.load_latency_ns))  # type: ignore[attr-defined]
        return measured(2000, 22.0)

    monkeypatch.setattr(perf, "short_bench", fake)
    rack = rack_context(manifest, host="cpu-demo")
    snapshot = beluga_like()
    report = run_doctor(Host.local(), rack=rack, snapshot=snapshot, perf=perf_probe(rack, None))
    checks = {o.id: o for o in report.outcomes}
    assert pools == [("/dev/dax0.0", 750)]
    assert checks["perf.load-latency"].status.value == "warn" and checks["perf.read-bandwidth"].status.value == "ok"
    plain = run_doctor(Host.local(), rack=rack, snapshot=snapshot)
    assert {o.status.value for o in plain.outcomes if o.id in IDS} == {"skip"}
    assert len(pools) == 1  # without --perf nothing is measured
    assert "no manifest" in perf_probe(None, None).unavailable


def test_doctor_perf_on_a_capture_skips_with_why(cli, monkeypatch):
    monkeypatch.setattr(perf, "short_bench", lambda *a: pytest.fail("nothing to measure here"))
    result = cli("doctor", "--perf", "--json", "-f", str(LAB), "--host", "lab-1", "--root", str(LAB_GUEST))
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    assert all(checks[i]["status"] == "skip" and "--root" in checks[i]["reason"] for i in IDS)
