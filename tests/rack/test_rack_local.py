"""Rack orchestration end to end with real belugactl processes on this machine.

Each "host" is a belugactl process run locally (the local transport); the pool is a file that
every host maps, as the lab's guests map one backing file. A transport that rewrites one host's
command stands in for a host that is misconfigured (another device, another manifest copy).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from belugactl.model.manifest import load_manifest
from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.rack.fanout import CommandTransport
from belugactl.workflows.rack.orchestrate import RackTarget, rack_doctor, rack_setup, select_hosts
from belugactl.workflows.rack.probe import PROBE_SIZE, ProbeRecord, judge
from belugactl.workflows.rack_context import load_rack_context

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "examples" / "lab.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "lab-guest"


class RewritingTransport(CommandTransport):
    """Local processes; doctor reads a fixture tree; `swap` rewrites arguments for chosen hosts."""

    def __init__(self, swap: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__(prefix=[])
        self.swap = swap or {}

    def argv(self, host, remote):
        args = list(remote)
        if "doctor" in args:
            args += ["--root", str(FIXTURE)]
        return [self.swap.get(host, {}).get(a, a) for a in args]


def _target(tmp_path: Path, transport, manifest: Path = LAB) -> RackTarget:
    pool = tmp_path / "pool.raw"
    if not pool.exists():
        create_file_pool(pool, load_manifest(manifest))
    rack = load_rack_context(manifest)
    return RackTarget(
        rack=rack,
        hosts=select_hosts(rack.manifest, None),
        transport=transport,
        remote_belugactl=[sys.executable, "-m", "belugactl"],
        fanout=4,
        timeout_s=120,
        pool=str(pool),
    )


def test_probe_record_judgement():
    rec = ProbeRecord.new(1, "lab-2", 77).pack()
    assert len(rec) == PROBE_SIZE
    assert judge(rec, host_index=1, host="lab-2", nonce=77)[0] == "ok"
    assert judge(rec, host_index=1, host="lab-2", nonce=78)[0] == "stale"
    assert judge(rec, host_index=0, host="lab-1", nonce=77)[0] == "wrong-host"
    assert judge(bytes(PROBE_SIZE), host_index=1, host="lab-2", nonce=77)[0] == "missing"
    flipped = bytearray(rec)
    flipped[20] ^= 1
    assert judge(bytes(flipped), host_index=1, host="lab-2", nonce=77)[0] == "garbage"
    assert judge(b"\xff" * 10, host_index=1, host="lab-2", nonce=77)[0] == "garbage"


@pytest.mark.process
def test_rack_doctor_all_green_probe(tmp_path):
    report = rack_doctor(_target(tmp_path, RewritingTransport()))
    assert report.host_errors == {}
    assert {h: r["status"] for h, r in report.skew.items()} == {"lab-1": "ok", "lab-2": "ok"}
    assert report.probe is not None
    statuses = {(r, w): c["status"] for r, row in report.probe.items() for w, c in row.items()}
    assert statuses == {(r, w): "ok" for r in ("lab-1", "lab-2") for w in ("lab-1", "lab-2")}
    # every check ran on both hosts, from the fixture tree
    assert all(set(cells) == {"lab-1", "lab-2"} for cells in report.checks.values())
    assert len(report.checks) >= 20


@pytest.mark.process
def test_rack_doctor_names_a_host_on_another_device(tmp_path):
    target = _target(tmp_path, RewritingTransport())
    # Another "device": same header (so the host believes it is fine), none of the others' bytes.
    other = tmp_path / "other.raw"
    shutil.copyfile(target.pool, other)
    target.transport = RewritingTransport({"lab-2": {target.pool: str(other)}})
    report = rack_doctor(target, checks=False)
    assert report.probe is not None
    assert report.probe["lab-1"]["lab-1"]["status"] == "ok"
    assert report.probe["lab-1"]["lab-2"]["status"] == "missing"  # lab-2 wrote elsewhere
    assert report.probe["lab-2"]["lab-1"]["status"] == "missing"  # lab-2 cannot see lab-1
    assert "lab-2" in report.failed_hosts


@pytest.mark.process
def test_rack_doctor_version_skew_from_a_different_manifest_copy(tmp_path):
    changed = tmp_path / "lab-changed.yaml"
    changed.write_text(LAB.read_text().replace("shared_kv: 254MiB", "shared_kv: 252MiB"))
    target = _target(tmp_path, RewritingTransport())
    target.transport = RewritingTransport({"lab-2": {str(LAB): str(changed)}})
    report = rack_doctor(target, checks=False)
    assert report.skew["lab-1"]["status"] == "ok"
    assert report.skew["lab-2"]["status"] == "fail"
    assert "pool layout differs" in report.skew["lab-2"]["reason"]
    # lab-2's own layout disagrees with the pool header: its probe cannot even map the pool
    assert "lab-2" in report.probe_errors
    assert report.failed_hosts == ["lab-2"]


@pytest.mark.process
def test_unreachable_host_is_named(tmp_path):
    class Unreachable(RewritingTransport):
        def __init__(self) -> None:
            super().__init__()
            self.unreachable_rc = 255  # what OpenSSH exits with when it cannot connect

        def argv(self, host, remote):
            if host == "lab-2":
                return [sys.executable, "-c", "import sys; print('ssh: connect: No route to host', "
                        "file=sys.stderr); sys.exit(255)"]
            return super().argv(host, remote)

    report = rack_doctor(_target(tmp_path, Unreachable()), probe=False, checks=False)
    assert "unreachable" in report.host_errors["lab-2"]
    assert "No route to host" in report.host_errors["lab-2"]
    assert report.failed_hosts == ["lab-2"]
    # reached by nothing, so checked by nothing: unreachable (exit 3), not a failing host
    summary = report.summary()
    assert summary.failing == [] and list(summary.unreachable) == ["lab-2"] and summary.exit_code == 3
    assert summary.unreachable["lab-2"].reason == "ssh: connect: No route to host"
    assert "ping lab-2" in summary.unreachable["lab-2"].fix


@pytest.mark.process
def test_setup_orders_first_host_alone_then_the_rest(tmp_path):
    run = rack_setup(_target(tmp_path, RewritingTransport()), dry_run=True, force=False)
    assert run.order == [["lab-1"], ["lab-2"]]


def test_select_hosts_validates_node_sets():
    from belugactl.errors import UsageError

    m = load_manifest(LAB)
    assert select_hosts(m, "lab-[1-2]") == ["lab-1", "lab-2"]
    assert select_hosts(m, "lab-2") == ["lab-2"]
    with pytest.raises(UsageError):
        select_hosts(m, "lab-[3-4]")
    with pytest.raises(UsageError):
        select_hosts(m, "lab-[")
