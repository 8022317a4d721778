"""`doctor` as one call: validate flags, discover the host, pick the manifest's entry, run every check."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from belugactl.errors import UsageError
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY, Registry
from belugactl.workflows.doctor.result import DoctorReport
from belugactl.workflows.doctor.runner import run_checks, validate_ignores

if TYPE_CHECKING:
    from belugactl.host.host import Host
    from belugactl.host.snapshot import HostSnapshot


def builtin_registry() -> Registry:
    """The registry with every built-in check loaded."""
    import belugactl.workflows.doctor.checks  # noqa: F401 - registers the checks

    return REGISTRY


def run_doctor(
    host: Host,
    *,
    manifest_path: str | None = None,
    host_name: str | None = None,
    ignore: Iterable[str] = (),
    registry: Registry | None = None,
    snapshot: HostSnapshot | None = None,
) -> DoctorReport:
    """Check a host; raise UsageError / ManifestError for bad flags or a bad manifest (exit 2)."""
    registry = registry if registry is not None else builtin_registry()
    ignores = validate_ignores(registry, ignore)  # before any slow work: a typo should fail fast
    if host_name is not None and manifest_path is None:
        raise UsageError("--host needs a manifest", fix="pass -f rack.yaml together with --host NAME")
    manifest = None
    if manifest_path is not None:
        from belugactl.model.manifest import load_manifest

        manifest = load_manifest(manifest_path)
    if snapshot is None:
        from belugactl.workflows.discover import discover

        snapshot = discover(host)
    expect = None
    if manifest is not None:
        from belugactl.workflows.doctor.expectations import from_manifest, pick_host

        entry = pick_host(manifest, host_name, snapshot.hostname, file=manifest_path or "the manifest")
        expect = from_manifest(manifest, entry)
    ctx = DoctorContext(snapshot, expect, host)
    outcomes = run_checks(registry, ctx, ignores)
    notes = []
    if not ctx.has_cxl:
        notes.append("no CXL on this host: no /sys/bus/cxl, no CXL memory devices or adapters")
    if expect is None:
        notes.append("no manifest: generic checks only (pass -f rack.yaml to check this host against its entry)")
    else:
        notes.append(f"checked against host {expect.host_name} in {manifest_path}")
    return DoctorReport(
        hostname=snapshot.hostname or "unknown",
        host_entry=expect.host_name if expect is not None else None,
        manifest=manifest_path,
        outcomes=tuple(outcomes),
        notes=tuple(notes),
    )
