"""The pool's measured speed against the manifest's `pool.expect` (`belugactl doctor --perf`).

Only with `--perf` is anything measured: the CLI hands `run_doctor` a `PerfProbe`, which runs a
short `bench pool` once, read only (doctor changes nothing: the hashed chase and invalidated reads
of the shared KV area, `workflows/bench/pool_speed.py`), and the three checks compare its figures
(`pool_speed.compare`). Without `--perf` they skip. An emulated device (the lab, any guest) and a file
pool are measured and shown but never compared. Tests swap the measuring function (`PerfProbe.measure`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from belugactl.workflows.bench import pool_speed
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity

NOT_ASKED = "not measured (pass --perf to run a short read-only bench of the pool)"
PERF_THREADS = [1, 2]
PERF_SIZE = 32 * pool_speed.MiB


def short_bench(path: str, manifest: Any) -> dict[str, Any]:  # noqa: ANN401
    """The measurement --perf runs: read only, 32 MiB per device, one and two threads, one run each."""
    return pool_speed.bench_pool(path, manifest=manifest, threads=PERF_THREADS, size=PERF_SIZE, read_only=True,
                                 repeat=1)  # fmt: skip


@dataclass
class PerfProbe:
    """What `doctor --perf` measures, once per run, for the perf checks.

    `pool`: the pool's path (the rack context's rule); `unavailable`: why there is none (then every
    perf check skips with it); `measure(path, manifest) -> bench document`, swappable."""

    pool: str | None = None
    unavailable: str | None = None
    measure: Callable[[str, Any], dict[str, Any]] | None = None  # None: short_bench, looked up when measuring
    _doc: dict[str, Any] | None = field(default=None, init=False)
    _error: str | None = field(default=None, init=False)

    def document(self, ctx: DoctorContext) -> dict[str, Any] | str:
        """The bench document, or why there is none."""
        if self.unavailable is not None:
            return self.unavailable
        if ctx.host is not None and not ctx.host.is_live:
            return "the host is a capture or fixture tree (--root): nothing to measure"
        if self.pool is None:
            return "no pool to measure (pass -f rack.yaml; the manifest names the pool)"
        if self._doc is None and self._error is None:
            manifest = ctx.expect.manifest if ctx.expect is not None else None
            try:
                self._doc = (self.measure or short_bench)(self.pool, manifest)
            except Exception as exc:  # noqa: BLE001 - a bench that cannot run is a skip with its reason
                what = getattr(exc, "what", None) or str(exc)
                self._error = f"could not measure {self.pool}: {what}"
        return self._doc if self._doc is not None else str(self._error)


@dataclass(frozen=True)
class PerfContext(DoctorContext):
    """A DoctorContext that also carries `doctor --perf`'s probe."""

    perf: PerfProbe | None = None


def _judge(ctx: DoctorContext, figure: str) -> CheckResult:
    probe = getattr(ctx, "perf", None)
    if probe is None:
        return CheckResult.skip(NOT_ASKED)
    expect = getattr(getattr(ctx.expect, "manifest", None), "pool", None)
    expect = getattr(expect, "expect", None)
    doc = probe.document(ctx)
    if isinstance(doc, str):
        return CheckResult.skip(doc)
    verdict = next(v for v in pool_speed.compare(doc, expect) if v.figure == figure)
    pool = doc.get("pool", {})
    details: dict[str, object] = {
        "measured": verdict.measured,
        "expected": verdict.expected,
        "device": verdict.device,
        "emulated": bool(pool.get("emulated")),
        "pool_kind": pool.get("kind"),
        "pool": pool.get("path"),
    }
    if verdict.status == "skip":
        got = pool_speed.device_figure(doc, *_ROW[figure])
        if got is not None:
            details["measured"], details["device"] = got
        label = " (emulated)" if pool.get("emulated") else ""
        unit = " ns" if figure == "load_latency_ns" else " GB/s"
        shown = f"; measured {got[0]:g}{unit}{label}" if got is not None else ""
        return CheckResult.skip(verdict.reason + shown, **details)
    if verdict.status == "warn":
        return CheckResult.warn(verdict.reason, pool_speed.PERF_FIX, **details)
    return CheckResult.ok(verdict.reason, **details)


_ROW = {f: (row, higher) for f, row, higher in pool_speed.EXPECTED}


@REGISTRY.check("perf.load-latency", "the pool's load latency is as pool.expect says (--perf)", Severity.WARNING)
def load_latency(ctx: DoctorContext) -> CheckResult:
    return _judge(ctx, "load_latency_ns")


@REGISTRY.check(
    "perf.read-bandwidth", "each memory device reads as fast as pool.expect says (--perf)", Severity.WARNING
)
def read_bandwidth(ctx: DoctorContext) -> CheckResult:
    return _judge(ctx, "read_gbps_per_device")


@REGISTRY.check(
    "perf.write-bandwidth", "each memory device writes as fast as pool.expect says (--perf)", Severity.WARNING
)
def write_bandwidth(ctx: DoctorContext) -> CheckResult:
    return _judge(ctx, "write_gbps_per_device")
