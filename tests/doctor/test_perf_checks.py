"""`doctor --perf` (issue 33 item 3): the perf checks compare a measured bench document with the
manifest's `pool.expect`: ok, warn beyond the margin, skip without --perf, without an expectation, on
an emulated device or when nothing can be measured. The measuring function is swapped for fixtures."""

from __future__ import annotations

from types import SimpleNamespace

from belugactl.errors import EnvironmentProblem
from belugactl.model.manifest_schema import PoolExpect
from belugactl.workflows.doctor.checks import perf
from belugactl.workflows.doctor.checks.perf import PerfContext, PerfProbe
from tests.support.doctor_snapshots import beluga_like, ctx, expectations

IDS = ("perf.load-latency", "perf.read-bandwidth", "perf.write-bandwidth")
SEEDS = PoolExpect(load_latency_ns=750, read_gbps_per_device=22.5, write_gbps_per_device=20, margin_percent=20)


def measured(latency: float, read: float, *, emulated: bool = False, kind: str = "devdax") -> dict:
    """A `bench pool` document as --perf's read-only run makes it: two devices, no write figures."""
    rows = [{"region": "dram", "threads": 1, "load_latency_ns": 95.0, "read_gb_per_s": 12.0, "write_nt_gb_per_s": None}]
    for t in (1, 2):
        for name in ("device 0", "device 1"):
            rows.append({"region": name, "threads": t, "load_latency_ns": latency, "read_gb_per_s": read * t / 2,
                         "write_nt_gb_per_s": None})  # fmt: skip
    return {"pool": {"path": "/dev/dax0.0", "kind": kind, "emulated": emulated}, "rows": rows}


def run(doc_or_error: object, expect: PoolExpect | None = SEEDS) -> dict[str, object]:
    calls = []

    def measure(path: str, manifest: object) -> dict:
        calls.append(path)
        if isinstance(doc_or_error, Exception):
            raise doc_or_error
        return doc_or_error  # type: ignore[return-value]

    manifest = SimpleNamespace(pool=SimpleNamespace(expect=expect))
    probe = PerfProbe(pool="/dev/dax0.0", measure=measure)
    context = PerfContext(beluga_like(), expectations(manifest=manifest), None, perf=probe)
    out = {
        i: fn(context)
        for i, fn in zip(IDS, (perf.load_latency, perf.read_bandwidth, perf.write_bandwidth), strict=True)
    }
    assert len(calls) <= 1  # one short bench for the three checks
    return out


def test_within_the_margin_is_ok_and_writes_are_never_measured_by_doctor():
    got = run(measured(800, 21.0))
    assert got["perf.load-latency"].status.value == "ok" and "750" in got["perf.load-latency"].reason
    assert got["perf.read-bandwidth"].status.value == "ok"
    assert got["perf.read-bandwidth"].details["measured"] == 21.0  # the best over 1 and 2 threads
    write = got["perf.write-bandwidth"]
    assert write.status.value == "skip" and "belugactl bench pool" in write.reason


def test_worse_than_expected_by_more_than_the_margin_warns_with_the_fix():
    got = run(measured(1000, 15.0))
    for check in ("perf.load-latency", "perf.read-bandwidth"):
        assert got[check].status.value == "warn", got[check]
        assert "belugactl bench pool" in got[check].fix and "pool.expect" in got[check].fix
    assert got["perf.load-latency"].details["measured"] == 1000


def test_an_emulated_device_is_shown_but_never_compared():
    got = run(measured(90000, 0.1, emulated=True))
    for check in ("perf.load-latency", "perf.read-bandwidth"):
        assert got[check].status.value == "skip" and "emulated" in got[check].reason
        assert got[check].details["emulated"] is True and got[check].details["measured"] is not None


def test_no_expectation_no_perf_flag_or_a_failed_measurement_skip_with_the_reason():
    assert {r.status.value for r in run(measured(1000, 1.0), expect=None).values()} == {"skip"}
    plain = ctx(beluga_like(), expectations())
    assert perf.load_latency(plain).reason == perf.NOT_ASKED
    failed = run(EnvironmentProblem("cannot map /dev/dax0.0"))
    assert failed["perf.read-bandwidth"].status.value == "skip"
    assert "cannot map /dev/dax0.0" in failed["perf.read-bandwidth"].reason
