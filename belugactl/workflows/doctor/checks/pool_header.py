"""The on-media pool header: present, intact, and the same layout this host's manifest derives."""

from __future__ import annotations

from belugactl.errors import BelugaError, EnvironmentProblem, InputError
from belugactl.pool.device import device_path
from belugactl.units import MiB
from belugactl.workflows.doctor.checks.common import manifest_arg, setup_fix, skip_without_cxl, skip_without_manifest
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult


@REGISTRY.check(
    "pool.header", "the pool header is present and matches the manifest's layout", guards_data=True
)
def pool_header(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx) or skip_without_manifest(ctx)) is not None:
        return skip
    dev = ctx.pool_dax()
    if dev is None:
        return CheckResult.skip("no pool dax device, so no header to read (see dax.device-present)")
    if dev.mode == "system-ram":
        return CheckResult.skip(f"{dev.name} is system-ram, so there is no pool to read (see dax.mode-devdax)")
    if ctx.host is None:
        return CheckResult.skip("no access to the host's devices in this run")
    try:
        from belugactl.pool import header as header_mod
        from belugactl.pool.mapping import PoolMapping
    except ImportError as exc:
        return CheckResult.skip(f"no header reader in this build ({exc.name}): needs setup")
    path = dev.dev_path or device_path(dev.name)
    # A device-dax node can only be mapped, in multiples of its align; a plain pool file maps the same way.
    # The record is at most 384 + 64 * 16 bytes, but "blank" is judged over the whole header area, as
    # setup judges it (header_mod.occupied_reason): data past the first words is not a blank pool.
    area = header_mod.HEADER_REGION
    length = max(dev.align or 2 * MiB, area)
    try:
        with PoolMapping.window(ctx.host, path, length, writable=False) as window:
            data = window.read(0, area)
    except EnvironmentProblem as exc:
        return CheckResult.warn(
            f"cannot open {path} to read the header: {exc.why or exc.what}",
            "run doctor as root or as a member of the pool device's group",
        )
    except BelugaError as exc:
        return CheckResult.skip(f"cannot map {path}: {exc.what}")
    try:
        found = header_mod.PoolHeader.unpack(data)
    except InputError as exc:
        if header_mod.is_blank(data):
            return CheckResult.fail("the pool has no header yet: it was never initialized", setup_fix(ctx))
        no_magic = data[: len(header_mod.MAGIC)] == bytes(len(header_mod.MAGIC))
        if no_magic and header_mod.read_claim(data) == 0:  # and not blank: someone's data, no pool
            return CheckResult.fail(
                f"{path} is not a blank pool: {header_mod.occupied_reason(data)}; "
                "setup will refuse to write a header over it",
                f"check that {path} is the pool's device (pool.source in the manifest); if nothing on it is needed, "
                f"`belugactl setup -f {manifest_arg(ctx)} --force` writes the header over it (DISCARDS that data)",
            )
        return CheckResult.fail(
            f"the pool header at offset 0 of {path} is not valid: {exc.what}",
            exc.fix
            or "if no host uses the pool, re-initialize it with `belugactl setup --force` (discards its contents)",
        )
    summary = (
        f"header v{found.format_version}, pool {found.pool_uuid}, {len(found.hosts)} host(s), "
        f"epoch {found.epoch}, written by {found.created_by}"
    )
    details: dict[str, object] = {"header": found.to_dict()}
    if ctx.expect is None or ctx.expect.manifest is None or ctx.expect.layout is None:
        return CheckResult.ok(summary + " (no manifest to compare with)", **details)
    ours = header_mod.PoolHeader.from_layout(ctx.expect.manifest, ctx.expect.layout, created_by=ctx.expect.host_name)
    differences = header_mod.diff(ours, found)
    from belugactl.pool import membership

    if differences and (moved := membership.compare(ours, found, ctx.expect.layout)) is not None:
        details["members_change"] = moved.to_dict()
        return CheckResult.fail(
            f"{summary}: the pool has another membership than this manifest (version {moved.version}): "
            + "; ".join(moved.lines()),
            f"record it: belugactl setup -f {manifest_arg(ctx)} on one host (a membership change keeps every "
            "cached KV block; --dry-run shows it first), or use the manifest the rack runs with",
            **details,
        )
    if differences:
        shown = "; ".join(f"{field}: manifest {a!r}, pool {b!r}" for field, a, b in differences[:4])
        more = f"; and {len(differences) - 4} more" if len(differences) > 4 else ""
        details["differences"] = [{"field": f, "manifest": a, "pool": b} for f, a, b in differences]
        from belugactl.model.layout import stale_layout_note

        note = stale_layout_note(
            ctx.expect.manifest, ctx.expect.layout, found.layout_hash, found.geometry.ring_count,
            same_pool=found.pool_uuid == ours.pool_uuid,
        )  # fmt: skip
        change = header_mod.describe_change(ours, found)
        details["change"] = change
        changed = f"; what changed: {'; '.join(change)}" if change and not note else ""
        return CheckResult.fail(
            f"the pool header disagrees with this manifest{': ' + note if note else ''}{changed} ({shown}{more}): "
            "serving would corrupt other hosts' data",
            ("" if note else "use the rack's manifest (the same file on every host); ")
            + "only if the pool holds nothing worth keeping, re-initialize it: "
            f"belugactl setup -f {manifest_arg(ctx)} --force "
            "(rewrites the header; DESTROYS every cached KV block, the index journal and the host partitions' "
            "contents; stop serving on every host first)",
            **details,
        )
    if ctx.expect.host_name not in {h.name for h in found.hosts}:
        return CheckResult.fail(
            f"{summary}, but this host ({ctx.expect.host_name}) has no partition in it",
            "check --host; a host added to the manifest later needs a new pool layout (setup --force on an idle pool) "
            "unless the pool was laid out with layout.capacity (then setup records it, keeping the cache)",
            **details,
        )
    return CheckResult.ok(summary + ", matches the manifest", **details)
