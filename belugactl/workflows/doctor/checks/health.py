"""The memory devices' own health and poison lists (`cxl list -M -H`, `cxl list -R -L`).

A device that reported nothing is never called healthy: its check skips and says why. Poisoned
lines are placed in the pool (pool-relative byte ranges and the layout's area) in the check's
details, the same way the metadata server's own periodic check places them
(`pool/poison_reading.py:place_records`); a block on a poisoned line must not be served, and the
server quarantines such ranges (dataplane/mds/poison.py) when it reads them or is told of them
(`POST /poison`, which takes this report as it is).
"""

from __future__ import annotations

from belugactl.host.snapshot import CxlRegion, DaxDevice, MediaError, MemdevHealth
from belugactl.pool.poison_reading import place_records
from belugactl.units import format_size
from belugactl.workflows.doctor.checks.common import skip_without_cxl
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult

# Percent of the device's rated life used: warn with time to plan a replacement, fail near the end.
LIFE_USED_WARN_PERCENT = 80
LIFE_USED_FAIL_PERCENT = 95

HEALTH_FIX_READ = (
    "run `cxl list -M -H` as root (the health comes from the device's mailbox; a device or ndctl "
    "that answers nothing cannot be judged)"
)
MEDIA_FIX_READ = "run `cxl list -R -L` as root with ndctl 80 or newer (it reads the poison lists through tracefs)"

# Flags that mean the device lost data or must be replaced (fail) and those that warn of it (warn).
_FAIL_FLAGS = {
    "hw_replacement_needed": "hardware replacement needed",
    "media_data_lost": "media data lost",
    "media_persistence_lost": "media persistence lost",
    "media_not_ready": "media not ready",
}
_WARN_FLAGS = {
    "maintenance_needed": "maintenance needed",
    "performance_degraded": "performance degraded",
    "media_data_loss_imminent": "data loss imminent",
    "media_persistence_loss_imminent": "persistence loss imminent",
    "media_powerloss_data_loss": "data lost at the last power loss",
    "media_shutdown_data_loss": "data lost at the last shutdown",
}


def judge_health(health: MemdevHealth) -> tuple[list[str], list[str]]:
    """(failures, warnings) for one device, each a short phrase naming the fact."""
    fails = [text for name, text in _FAIL_FLAGS.items() if getattr(health, name)]
    warns = [text for name, text in _WARN_FLAGS.items() if getattr(health, name)]
    life = health.life_used_percent
    if health.ext_life_used == "critical" or (life is not None and life >= LIFE_USED_FAIL_PERCENT):
        fails.append(f"life used {life if life is not None else '?'} % (critical)")
    elif health.ext_life_used == "warning" or (life is not None and life >= LIFE_USED_WARN_PERCENT):
        warns.append(f"life used {life if life is not None else '?'} % (past {LIFE_USED_WARN_PERCENT} %)")
    temp = f"{health.temperature} C" if health.temperature is not None else "temperature"
    if health.ext_temperature == "critical":
        fails.append(f"{temp}: critical")
    elif health.ext_temperature == "warning":
        warns.append(f"{temp}: warning")
    if health.dirty_shutdowns:
        warns.append(f"{health.dirty_shutdowns} dirty shutdown(s)")
    for kind in ("volatile", "persistent"):
        if getattr(health, f"ext_corrected_{kind}") == "warning":
            warns.append(f"corrected {kind} errors past the device's warning threshold")
    return fails, warns


def _health_details(health: MemdevHealth) -> dict[str, object]:
    keys = ("life_used_percent", "temperature", "dirty_shutdowns", "ext_life_used", "ext_temperature")
    return {k: getattr(health, k) for k in keys}


@REGISTRY.check("cxl.memdev-health", "every CXL memory device reports good health (life, temperature, status)")
def memdev_health(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    memdevs = ctx.snapshot.cxl.memdevs
    if not memdevs:
        return CheckResult.skip("no CXL memory devices (see cxl.memdevs-present)")
    unreported = [m.name for m in memdevs if m.health is None]
    if len(unreported) == len(memdevs):
        return CheckResult.skip(
            f"health not reported for {', '.join(unreported)}: not known to be healthy", fix=HEALTH_FIX_READ
        )
    fails: list[str] = []
    warns: list[str] = []
    details: dict[str, object] = {"unreported": unreported}
    for m in memdevs:
        if m.health is None:
            continue
        details[m.name] = _health_details(m.health)
        f, w = judge_health(m.health)
        fails += [f"{m.name}: {t}" for t in f]
        warns += [f"{m.name}: {t}" for t in w]
    if unreported:
        warns.append(f"health not reported for {', '.join(unreported)}")
    dirty = any("dirty shutdown" in w for w in warns)
    wear = [t for t in fails + warns if "dirty shutdown" not in t and "not reported" not in t]
    fix_parts = []
    if wear:
        fix_parts.append(
            "plan the device's replacement with its vendor (`cxl list -M -H` shows the flags); "
            "move the pool off it first"
        )
    if dirty:
        fix_parts.append(
            "dirty shutdowns count for the device's whole life: if the count grew since the last clean boot, "
            "what was written to the pool before the power loss may be torn: restart the metadata server with "
            "--restart-policy start-empty (a device pool's default is journal) and never replay its journal "
            "over that boot"
        )
    if unreported:
        fix_parts.append(HEALTH_FIX_READ)
    if fails:
        return CheckResult.fail("; ".join(fails + warns), "; ".join(fix_parts), **details)
    if warns:
        return CheckResult.warn("; ".join(warns), "; ".join(fix_parts), **details)
    described = ", ".join(
        f"{m.name} life used {m.health.life_used_percent if m.health.life_used_percent is not None else '?'} %"
        + (f", {m.health.temperature} C" if m.health.temperature is not None else "")
        for m in memdevs
        if m.health is not None
    )
    return CheckResult.ok(f"healthy: {described}", **details)


# --- poison -----------------------------------------------------------------------------------


def _pool_region(regions: list[CxlRegion], dax: DaxDevice | None) -> CxlRegion | None:
    if dax is None or dax.resource is None:
        return None
    for r in regions:
        if r.resource is not None and r.size and r.resource <= dax.resource < r.resource + r.size:
            return r
    return None


def _area(layout: object, offset: int) -> str | None:
    regions = getattr(layout, "regions", None)
    if regions is None:
        return None
    for area in regions():
        if area.offset <= offset < area.offset + area.size:
            return str(area.name)
    return None


def pool_ranges(
    region: CxlRegion, dax: DaxDevice, records: list[MediaError], layout: object = None
) -> tuple[list[dict[str, object]], list[MediaError]]:
    """Records as pool-relative byte ranges (clipped to the dax device), and the records outside it.

    A region offset is from the region's base (HPA), so interleave is already accounted for; the pool
    starts at the dax device's physical address, which a devdax namespace puts after its info block."""
    assert region.resource is not None and dax.resource is not None
    placed, outside = place_records(region.resource, dax.resource, dax.size or 0, records)
    inside: list[dict[str, object]] = []
    for lo, length, rec in placed:
        item: dict[str, object] = {"offset": lo, "length": length, "source": rec.source}
        area = _area(layout, lo)
        if area is not None:
            item["area"] = area
        inside.append(item)
    return inside, outside


def _describe(rec: MediaError) -> str:
    return f"0x{rec.offset:x}+{rec.length}" + (f" ({rec.source})" if rec.source else "")


@REGISTRY.check("cxl.media-errors", "no poisoned (media error) lines in the CXL regions", guards_data=True)
def media_errors(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    regions = ctx.snapshot.cxl.regions
    if not regions:
        return CheckResult.skip("no CXL region (see cxl.region-committed)")
    unread = [r.name for r in regions if r.media_errors is None]
    if len(unread) == len(regions):
        return CheckResult.skip(
            f"poison lists not read for {', '.join(unread)}: not known to be clean", fix=MEDIA_FIX_READ
        )
    dax = ctx.pool_dax()
    pool_region = _pool_region(regions, dax)
    layout = ctx.expect.layout if ctx.expect is not None else None
    poisoned: list[dict[str, object]] = []
    by_region: dict[str, list[str]] = {}
    outside_pool: list[str] = []
    unplaced: list[str] = []
    for r in regions:
        records = r.media_errors or []
        if not records:
            continue
        by_region[r.name] = [_describe(rec) for rec in records]
        if r is pool_region and dax is not None:
            inside, outside = pool_ranges(r, dax, records, layout)
            poisoned += inside
            outside_pool += [f"{r.name} {_describe(rec)}" for rec in outside]
        else:
            unplaced += [f"{r.name} {_describe(rec)}" for rec in records]
    details: dict[str, object] = {
        "regions": by_region,
        # Pool-relative byte ranges of the pool's device: what the metadata server must not serve.
        "poisoned_pool_ranges": poisoned,
        "pool_device": dax.name if dax is not None and pool_region is not None else None,
        "unread": unread,
    }
    if not by_region:
        clean = [r.name for r in regions if r.media_errors is not None]
        if unread:
            return CheckResult.warn(
                f"no media errors in {', '.join(clean)}; poison lists not read for {', '.join(unread)}",
                MEDIA_FIX_READ,
                **details,
            )
        return CheckResult.ok(f"no media errors in {', '.join(clean)}", **details)
    fix = (
        "a block on a poisoned line must not be served: the metadata server reads its device's poison lists every "
        "serve.metadata.poison_check_s (60 s), quarantines the lines in the shared KV area and drops the blocks on "
        "them (/stats poison); to tell it now: `belugactl doctor --push-poison http://127.0.0.1:9470` "
        "on the metadata host (its admin port; beyond loopback, with the rack secret). Poison on the header, "
        "rings or journal it cannot quarantine (it says so on /readyz): stop serving and lay the pool out "
        "again. Have the device's poison cleared or the device replaced (vendor procedure; `cxl list -R -L` "
        "lists the records)"
    )
    if poisoned:
        ranges = ", ".join(
            f"0x{p['offset']:x}+{p['length']}" + (f" in {p['area']}" if "area" in p else "") for p in poisoned
        )
        extra = f"; also outside the pool: {', '.join(outside_pool)}" if outside_pool else ""
        return CheckResult.fail(
            f"{len(poisoned)} poisoned range(s) inside the pool's device {dax.name if dax else '?'}: {ranges}{extra}",
            fix,
            **details,
        )
    if unplaced:
        return CheckResult.fail(
            "poisoned lines in CXL region(s): "
            + ", ".join(unplaced)
            + " (region offsets: they cannot be placed in the pool, since no manifest names its device or its "
            "physical address was not read)",
            fix,
            **details,
        )
    size = format_size(dax.size or 0) if dax is not None else "?"
    return CheckResult.warn(
        f"poisoned lines in {pool_region.name if pool_region else '?'} outside the pool's {size} device: "
        + ", ".join(outside_pool),
        "the pool's data is not on them (a namespace's info block or unused capacity); have the poison cleared "
        "or the device replaced before the space is used",
        **details,
    )
