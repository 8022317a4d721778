"""`doctor` as one call: validate flags, discover the host, pick the manifest's entry, run every check."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from belugactl.workflows.doctor.check_runner import run_checks, validate_ignores
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY, Registry
from belugactl.workflows.doctor.result import DoctorReport

if TYPE_CHECKING:
    from belugactl.host.host import Host
    from belugactl.host.snapshot import HostSnapshot
    from belugactl.workflows.doctor.checks.perf import PerfProbe
    from belugactl.workflows.rack_context import RackContext


def builtin_registry() -> Registry:
    """The registry with every built-in check loaded."""
    import belugactl.workflows.doctor.checks  # noqa: F401 - registers the checks

    return REGISTRY


def run_doctor(
    host: Host,
    *,
    rack: RackContext | None = None,
    ignore: Iterable[str] = (),
    registry: Registry | None = None,
    snapshot: HostSnapshot | None = None,
    perf: PerfProbe | None = None,
) -> DoctorReport:
    """Check a host, against its entry in `rack` when given; raise UsageError for bad flags (exit 2).
    `perf` (`doctor --perf`): the probe the perf checks measure the pool with (checks/perf.py)."""
    registry = registry if registry is not None else builtin_registry()
    ignores = validate_ignores(registry, ignore)  # before any slow work: a typo should fail fast
    if snapshot is None:
        from belugactl.workflows.discover import discover

        snapshot = discover(host)
    expect = None
    if rack is not None:
        from belugactl.workflows.doctor.expectations import from_context

        # The snapshot's hostname, not this process's: with --root the tree says which host it is.
        expect = from_context(rack, rack.host(snapshot.hostname))
    if perf is not None:
        from belugactl.workflows.doctor.checks.perf import PerfContext

        ctx: DoctorContext = PerfContext(snapshot, expect, host, perf=perf)
    else:
        ctx = DoctorContext(snapshot, expect, host)
    outcomes = run_checks(registry, ctx, ignores)
    notes = []
    if not ctx.has_cxl:
        notes.append("no CXL on this host: no /sys/bus/cxl, no CXL memory devices or adapters")
    if rack is None or expect is None:
        notes.append("no manifest: generic checks only (pass -f rack.yaml to check this host against its entry)")
    else:
        notes.append(f"checked against host {expect.host_name} in {rack.file}")
    return DoctorReport(
        hostname=snapshot.hostname or "unknown",
        host_entry=expect.host_name if expect is not None else None,
        manifest=rack.file if rack is not None else None,
        outcomes=tuple(outcomes),
        notes=tuple(notes),
        has_cxl=ctx.has_cxl,
    )
