"""Doctor on the fixture host trees: the status of every check, check by check, plus the CLI.

The trees (tests/fixtures/<name>/, see tests/fixtures/README.md) are hand-written from documented
formats: `lab-guest` a QEMU lab guest with a devdax pool, `beluga-intel` a 2-socket Intel host with
DDIO on and the pool onlined as system-ram, `amd-host` an AMD host set up correctly, `nocxl` a plain
host without CXL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.host.host import Host
from belugactl.workflows.doctor import Status, builtin_registry, run_doctor
from belugactl.workflows.rack_context import load_rack_context

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# Expected status per check (rows) and fixture (columns), without a manifest: the checks of the pool's
# own device skip (no manifest names it, and doctor does not guess); dax.mode-devdax still judges every
# CXL dax device, since none of them may be system-ram whichever is the pool.
TABLE = """
check                      lab-guest beluga-intel amd-host nocxl
tools.cxl-present          ok        ok           ok       ok
tools.ndctl-present        ok        ok           ok       ok
tools.daxctl-present       ok        ok           ok       ok
tools.ndctl-version        ok        ok           ok       skip
kernel.cxl-bus             ok        ok           ok       skip
kernel.version             ok        ok           ok       ok
kernel.lockdown            ok        ok           ok       ok
cxl.memdevs-present        ok        ok           ok       skip
cxl.decoder-capacity       ok        ok           ok       skip
cxl.region-committed       ok        ok           ok       skip
cxl.region-geometry        skip      skip         skip     skip
cxl.memdev-health          skip      skip         skip     skip
cxl.media-errors           skip      skip         skip     skip
dax.device-present         skip      skip         skip     skip
dax.mode-devdax            ok        fail         ok       skip
dax.map-mem                skip      skip         skip     skip
dax.align                  skip      skip         skip     skip
dax.size-matches-manifest  skip      skip         skip     skip
dax.namespace-uuid         skip      skip         skip     skip
dax.namespace-name         skip      skip         skip     skip
dax.permissions            skip      skip         skip     skip
numa.cxl-node-discovered   ok        ok           ok       skip
numa.cxl-node-cpuless      ok        ok           ok       skip
memory.auto-online         ok        fail         ok       ok
hugepages.per-node         skip      skip         skip     skip
thp.mode                   ok        ok           ok       ok
ddio.disabled              skip      fail         skip     skip
mtrr.pool-uncachable       skip      skip         skip     skip
mtrr.kv-uncachable         skip      skip         skip     skip
mtrr.control-cached        skip      skip         skip     skip
gpu.count                  skip      skip         skip     skip
gpu.numa-locality          skip      ok           ok       ok
pci.root-ports-found       ok        ok           ok       ok
pci.link-trained           ok        ok           ok       ok
pci.cxl-adapter-locality   skip      ok           ok       skip
pci.dsa-engines            skip      skip         skip     skip
pool.header                skip      skip         skip     skip
pool.interleave-zones      skip      skip         skip     skip
discover.complete          ok        ok           ok       ok
etcd.reachable             skip      skip         skip     skip
etcd.quorum                skip      skip         skip     skip
etcd.clock-skew            skip      skip         skip     skip
etcd.lease-ttl             skip      skip         skip     skip
etcd.leader                skip      skip         skip     skip
metadata.journal           skip      skip         skip     skip
perf.load-latency          skip      skip         skip     skip
perf.read-bandwidth        skip      skip         skip     skip
perf.write-bandwidth       skip      skip         skip     skip
"""


def _table() -> dict[str, dict[str, str]]:
    header, *rows = [line.split() for line in TABLE.strip().splitlines()]
    return {name: {row[0]: row[i] for row in rows} for i, name in enumerate(header) if i}


EXPECTED = _table()


def _report(name: str, **kwargs):
    return run_doctor(Host.from_tree(FIXTURES / name), **kwargs)


def test_the_table_covers_every_registered_check():
    for name, statuses in EXPECTED.items():
        assert list(statuses) == builtin_registry().ids, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_check_on_every_fixture(name):
    report = _report(name)
    got = {o.id: o.status.value for o in report.outcomes}
    wrong = {
        i: (EXPECTED[name][i], got[i], o.result.reason)
        for i, o in ((o.id, o) for o in report.outcomes)
        if got[i] != EXPECTED[name][i]
    }
    assert wrong == {}
    assert not any(o.crashed for o in report.outcomes)
    for outcome in report.outcomes:
        assert outcome.result.reason
        if outcome.status in (Status.FAIL, Status.WARN):
            assert outcome.result.fix, outcome.id


def test_beluga_intel_reasons_name_the_facts():
    by_id = {o.id: o.result for o in _report("beluga-intel").outcomes}
    assert "dax0.0" in by_id["dax.mode-devdax"].reason and "system-ram" in by_id["dax.mode-devdax"].reason
    assert "online_movable" in by_id["memory.auto-online"].reason
    ddio = by_id["ddio.disabled"]
    # every root port above a GPU or CXL adapter, each with its register value
    ports = ddio.details["ports"]
    assert len(ports) >= 2 and all(v["perfctrlsts_0"] & 0x80 for v in ports.values())
    assert all(f"setpci -s {bdf} 180.b=00:88" in ddio.fix for bdf in ports)
    assert by_id["numa.cxl-node-discovered"].details["nodes"] == [2]


def test_nocxl_skips_say_there_is_no_cxl():
    report = _report("nocxl")
    assert report.exit_code == 3  # nothing CXL was checked: no pass
    assert report.exit_code_for(allow_no_cxl=True) == 0
    assert any("no CXL" in note for note in report.notes)
    for check_id in (
        "kernel.cxl-bus",
        "cxl.memdevs-present",
        "dax.mode-devdax",
        "numa.cxl-node-cpuless",
        "ddio.disabled",
    ):
        outcome = next(o for o in report.outcomes if o.id == check_id)
        assert "no CXL" in outcome.result.reason, check_id


def test_amd_host_ddio_is_skipped_with_the_vendor():
    outcome = next(o for o in _report("amd-host").outcomes if o.id == "ddio.disabled")
    assert outcome.status is Status.SKIP and "AuthenticAMD" in outcome.result.reason


# lab-guest is lab-1 after `belugactl setup -f examples/lab.yaml`: with that manifest, nothing fails.
LAB_SKIPS = {
    "ddio.disabled": "AuthenticAMD",  # and lab.yaml leaves DDIO unmanaged
    "mtrr.pool-uncachable": "write-back",
    "mtrr.kv-uncachable": "one memory type",
    "gpu.count": "no GPU count",
    "gpu.numa-locality": "no GPUs",
    "pool.header": "/dev/dax0.0",  # a tree holds no device files to map
    # recorded before discovery listed health and poison (tests/doctor/test_health.py adds them)
    "cxl.memdev-health": "not known to be healthy",
    "cxl.media-errors": "not known to be clean",
    "pci.cxl-adapter-locality": "0 GPU(s)",
    "pci.dsa-engines": "no Intel DSA",
    "pool.interleave-zones": "no software interleave",
    "perf.load-latency": "--perf",  # measured only when asked
    "perf.read-bandwidth": "--perf",
    "perf.write-bandwidth": "--perf",
    # lab.yaml elects no leader (no serve.metadata.etcd): tests/doctor/test_etcd_checks.py runs them
    **{f"etcd.{n}": "no serve.metadata.etcd" for n in ("reachable", "quorum", "clock-skew", "lease-ttl", "leader")},
}


def test_lab_guest_against_the_lab_manifest():
    report = _report("lab-guest", rack=load_rack_context(REPO / "examples" / "lab.yaml"))
    assert report.host_entry == "lab-1"  # picked by the tree's hostname
    by_id = {o.id: o for o in report.outcomes}
    assert list(by_id) == builtin_registry().ids
    for check_id, outcome in by_id.items():
        if check_id in LAB_SKIPS:
            assert outcome.status is Status.SKIP, (check_id, outcome.result.reason)
            assert LAB_SKIPS[check_id] in outcome.result.reason, check_id
        else:
            assert outcome.status is Status.OK, (check_id, outcome.result.reason)
    assert report.exit_code == 0
    # the pinned uuid is found as the namespace's label uuid; ndctl's uuid (the info block's) differs
    assert "label uuid 5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01" in by_id["dax.namespace-uuid"].result.reason
    assert by_id["hugepages.per-node"].status is Status.OK  # 64 x 2 MiB on node 0, as lab.yaml asks


def test_cli_lab_guest_with_the_lab_manifest_passes(capsys):
    code, data = _cli_json(
        capsys, "--root", str(FIXTURES / "lab-guest"), "-f", str(REPO / "examples" / "lab.yaml"), "--host", "lab-1"
    )
    assert code == 0
    assert [c["id"] for c in data["checks"] if c["status"] in ("fail", "warn")] == []


# --- the CLI on the trees ------------------------------------------------------------------------


def _cli_json(capsys, *args: str) -> tuple[int, dict]:
    code = run(["doctor", "--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, json.loads(captured.out)


def test_cli_beluga_intel_exits_1_with_the_system_ram_and_ddio_failures(capsys):
    code, data = _cli_json(capsys, "--root", str(FIXTURES / "beluga-intel"))
    assert code == 1
    failed = {c["id"] for c in data["checks"] if c["status"] == "fail"}
    assert {"dax.mode-devdax", "ddio.disabled"} <= failed
    for check in data["checks"]:
        assert set(check) >= {"id", "status", "reason", "fix"}


def test_cli_nocxl_exits_3_with_skips_saying_no_cxl(capsys):
    code, data = _cli_json(capsys, "--root", str(FIXTURES / "nocxl"))
    assert code == 3
    assert data["has_cxl"] is False
    skips = [c for c in data["checks"] if c["status"] == "skip" and "no CXL" in c["reason"]]
    assert len(skips) >= 10


def test_cli_ignore_downgrades_the_failures_and_says_so(capsys):
    root = str(FIXTURES / "beluga-intel")
    code, data = _cli_json(
        capsys, "--root", root, "--ignore", "dax.mode-devdax", "--ignore", "ddio.disabled,memory.auto-online"
    )
    assert code == 0
    by_id = {c["id"]: c for c in data["checks"]}
    for check_id in ("dax.mode-devdax", "ddio.disabled", "memory.auto-online"):
        assert by_id[check_id]["status"] == "warn" and by_id[check_id]["ignored"]
        assert "ignored" in by_id[check_id]["reason"]
    # one failure left: still exit 1, and the human output names the escape hatch (a check that guards no data)
    assert run(["doctor", "--root", root, "--ignore", "dax.mode-devdax", "--ignore", "memory.auto-online"]) == 1
    out = capsys.readouterr().out
    assert "failure ignored" in out and "--ignore ddio.disabled" in out
    assert "[✗] ddio.disabled" in out and "[!] dax.mode-devdax" in out


def test_cli_unknown_ignore_exits_2_before_reading_the_host(capsys):
    assert run(["doctor", "--root", str(FIXTURES / "beluga-intel"), "--ignore", "dax.mode-devda"]) == 2
    err = capsys.readouterr().err
    assert "did you mean dax.mode-devdax" in err and "ddio.disabled" in err


def test_cli_human_output_has_symbols_fixes_and_summary(capsys):
    assert run(["doctor", "--root", str(FIXTURES / "beluga-intel")]) == 1
    out = capsys.readouterr().out
    assert "[✗] dax.mode-devdax" in out and "[✓] kernel.cxl-bus" in out and "[-] dax.map-mem" in out
    # the fix's prose wraps; its commands stand alone on their lines, whole, to be pasted
    assert "fix: stop what runs on that node, then\n" in out
    assert "\n             daxctl reconfigure-device --mode=devdax --force dax0.0\n" in out
    assert "Summary:" in out and "3 failed" in out
    assert "facts:" not in out
    assert run(["doctor", "--root", str(FIXTURES / "beluga-intel"), "-v"]) == 1
    verbose = capsys.readouterr().out
    assert "checks: DDIO off on the root ports" in verbose and '"perfctrlsts_0": 128' in verbose


def test_a_support_bundle_gives_the_same_verdicts_as_the_tree(capsys, tmp_path):
    bundle = tmp_path / "bundle.tar.gz"
    assert run(["discover", "--root", str(FIXTURES / "beluga-intel"), "--capture", str(bundle), "--json"]) == 0
    capsys.readouterr()
    code, from_bundle = _cli_json(capsys, "--root", str(bundle))
    _, from_tree = _cli_json(capsys, "--root", str(FIXTURES / "beluga-intel"))
    assert code == 1
    assert [(c["id"], c["status"]) for c in from_bundle["checks"]] == [
        (c["id"], c["status"]) for c in from_tree["checks"]
    ]
