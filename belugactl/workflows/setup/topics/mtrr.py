"""Marking the pool's physical range uncachable with variable MTRRs: the whole pool, or with a
memory-type split (caching.memory_types: seeds) exactly the shared KV area's pieces.

An MTRR covers a power-of-two size at a base aligned to that size, so a range is split into the
fewest such pieces (greedy from the low end: the largest piece the base's alignment and the
remaining length allow). Setup checks there are enough free registers before writing any, and
remembers exactly which registers it added, tied to the boot id: teardown removes only those,
and after a reboot (when the kernel forgot them) the memory of them is dropped too.

A split's KV area is given in pool offsets (`PoolLayout.uncachable_spans`, the same on every host);
its physical pieces depend on where this host maps the pool, so they are counted here, per host,
and a host with too few free variable MTRRs is refused before anything is written. Entries setup
added earlier that the manifest no longer wants (a whole-pool range before a split) are removed.
"""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem, InputError, StepFailed
from belugactl.host.host import Host
from belugactl.host.setup_state import boot_id
from belugactl.host.snapshot import MtrrEntry
from belugactl.host.write_mtrr import add_mtrr, read_mtrr, remove_mtrr, variable_mtrr_count
from belugactl.model.layout import split_geometry
from belugactl.model.setup_plan import MtrrAdd, MtrrRemove, Skip, Step
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.pool_lookup import find_pool_region, pool_dax
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import ApplyContext, Planned, SetupTopic

ID = "mtrr"
PAGE = 4096
# Intel CPUs have had 8 or more variable MTRRs since the P6; used only when IA32_MTRRCAP is unreadable.
ASSUMED_VARIABLE_MTRRS = 8


def split_range(base: int, size: int) -> list[tuple[int, int]]:
    """[base, base+size) as the fewest (base, size) pieces, each a power of two aligned to itself."""
    if base % PAGE or size % PAGE or size <= 0:
        raise ValueError("MTRR ranges are whole, non-empty 4 KiB pages")
    pieces = []
    while size:
        align = base & -base if base else 1 << 63
        piece = min(align, 1 << (size.bit_length() - 1))
        pieces.append((base, piece))
        base += piece
        size -= piece
    return pieces


def span_pieces(hpa_base: int, offset: int, size: int) -> list[tuple[int, int]]:
    """The MTRR pieces for the pool bytes [offset, offset+size) of a pool mapped at hpa_base.

    The layout is in pool offsets and the same on every host; the physical base differs per host,
    so the piece count is computed here, per host."""
    return split_range(hpa_base + offset, size)


def granule_that_fits(hpa_base: int, offset: int, size: int, free: int) -> int | None:
    """The smallest power-of-two granule g such that [offset, offset+size) rounded inward to g
    splits into at most `free` pieces at this host's base; None when even the largest does not."""
    granule = PAGE
    while granule <= size:
        start = -(-(hpa_base + offset) // granule) * granule
        end = (hpa_base + offset + size) // granule * granule
        if end > start and len(split_range(start, end - start)) <= free:
            return granule
        granule <<= 1
    return None


def pool_ranges(target: SetupTarget, facts: SetupFacts) -> list[tuple[int, int]] | None:
    """The pool's physical range(s); None while the device does not exist yet."""
    region = find_pool_region(target, facts)
    if region is not None and region.resource is not None and region.size:
        return [(region.resource, region.size)]
    dax = pool_dax(target, facts)
    if dax is not None and dax.resource is not None and dax.size:
        return [(dax.resource, dax.size)]
    return None


def ours(facts: SetupFacts) -> list[dict]:
    """MTRR entries this belugactl added in the current boot (older ones died with that boot)."""
    if facts.state.get("boot_id") != facts.boot_id:
        return []
    return list(facts.state.get("mtrr", []))


def uncachable_spans(target: SetupTarget) -> tuple[tuple[int, int], ...] | None:
    """The pool offsets (offset, size) a split wants uncachable, None without a split.

    `SetupTarget.uncachable_spans` says it when the target carries the field (filled from
    `PoolLayout.uncachable_spans`); until then the header setup writes says it: only a split's layout
    puts the host partitions before the shared KV area (model/layout.py:split_geometry)."""
    spans = getattr(target, "uncachable_spans", None)
    if spans is not None or target.header is None:
        return spans
    ours = target.header.ours
    g = ours.geometry
    if split_geometry(g.shared_kv_offset, [h.offset for h in ours.hosts]):
        return ((g.shared_kv_offset, g.shared_kv_size),)
    return None


def _pool_base(target: SetupTarget, facts: SetupFacts) -> int | None:
    """Where pool offset 0 is in this host's physical address space: the dax device's start (a
    devdax namespace on a pmem region starts after its info block, not at the region)."""
    dax = pool_dax(target, facts)
    if dax is not None and dax.resource is not None and dax.size:
        return dax.resource
    return None


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    entries = facts.snapshot.mtrr
    spans = uncachable_spans(target)
    if not target.uncachable and not spans:
        leftovers = _still_listed(ours(facts), entries)
        if not leftovers:
            return Planned(skipped=[Skip(ID, "caching.pool_memory_type is write-back")])
        return Planned(steps=[_remove_step(leftovers, "the manifest now wants the pool write-back")])
    what = "the shared KV area" if spans else "the pool"
    if entries is None:
        raise EnvironmentProblem(
            f"the manifest wants {what} uncachable, but this machine has no /proc/mtrr",
            why="MTRRs are disabled or absent (common in VMs and on non-x86 machines)",
            fix="set caching.pool_memory_type: write-back (no memory_types) and rely on flushes / non-temporal stores",
        )
    if spans:
        base = _pool_base(target, facts)
        pieces = None if base is None else [p for off, size in spans for p in span_pieces(base, off, size)]
    else:
        ranges = pool_ranges(target, facts)
        pieces = None if ranges is None else [p for b, size in ranges for p in split_range(b, size)]
    if pieces is None:
        return Planned(steps=[
            Step(
                id="mtrr.add",
                topic=ID,
                summary=f"mark {what}'s physical range uncachable (MTRR)",
                deferred=True,
                note="the physical range is known once the region or dax device exists",
            )
        ])
    # Entries setup added that the manifest no longer wants (the whole pool before a split, a KV
    # area at other offsets): removed first, which also frees their registers.
    stale = [r for r in _still_listed(ours(facts), entries) if (r["base"], r["size"]) not in set(pieces)]
    missing = [(b, s) for b, s in pieces if not _listed(entries, b, s)]
    if not missing and not stale:
        return Planned()
    total = facts.mtrr_count
    note = None
    if total is None:
        total = ASSUMED_VARIABLE_MTRRS
        note = f"IA32_MTRRCAP unreadable (load the msr module); assuming {total} variable MTRRs"
    free = total - len(entries) + len(stale)
    if len(missing) > free:
        in_use = "in use: " + ", ".join(f"reg{e.reg:02d} {e.type} {format_size(e.size)}" for e in entries)
        if spans:
            raise InputError(
                f"the shared KV area's uncachable range needs {len(missing)} MTRR(s) on this host; "
                f"{free} of {total} are free ({len(pieces)} in all at physical base 0x{base:x})",
                why=in_use + "; nothing was changed",
                fix="lower caching.kv_mtrrs (the layout then aligns the KV area to fewer, larger pieces), map the "
                "pool at a physical base aligned to its largest piece (a ram region's dax device starts at the "
                "region), or free firmware MTRRs in the BIOS",
            )
        raise EnvironmentProblem(
            f"marking the pool uncachable needs {len(missing)} MTRR(s); {free} of {total} are free",
            why=in_use,
            fix="align the pool to a power of two, free firmware MTRRs in the BIOS, or use write-back",
        )
    steps = []
    if stale:
        steps.append(_remove_step(stale, f"the manifest wants only {what} uncachable now"))
    if missing:
        used = len(entries) - len(stale)
        steps.append(Step(
            id="mtrr.add",
            topic=ID,
            summary=f"mark {format_size(sum(s for _, s in missing))} of {what} uncachable "
            f"with {len(missing)} MTRR(s)",
            actions=tuple(MtrrAdd(b, s) for b, s in missing),
            before=f"{used} of {total} variable MTRRs used",
            after=f"{used + len(missing)} used",
            note="; ".join(n for n in (_split_note(spans, base) if spans else None, note) if n) or None,
        ))
    return Planned(steps=steps)


def _split_note(spans: tuple[tuple[int, int], ...], base: int) -> str:
    kv = ", ".join(f"{format_size(s)}@{o:#x}" for o, s in spans)
    return f"the KV area (pool offsets {kv}) at physical base 0x{base:x}; header, rings, journal stay write-back"


def _listed(entries: list[MtrrEntry], base: int, size: int) -> MtrrEntry | None:
    return next((e for e in entries if e.base == base and e.size == size and e.type == "uncachable"), None)


def _still_listed(remembered: list[dict], entries: list[MtrrEntry] | None) -> list[dict]:
    if not entries:
        return []
    return [r for r in remembered if any(e.reg == r["reg"] and e.base == r["base"] and e.size == r["size"]
                                         for e in entries)]


def _remove_step(remembered: list[dict], why: str) -> Step:
    return Step(
        id="mtrr.remove",
        topic=ID,
        summary=f"remove the {len(remembered)} MTRR(s) belugactl added",
        actions=tuple(MtrrRemove(r["reg"], r["base"], r["size"]) for r in remembered),
        before=", ".join(f"reg{r['reg']:02d}" for r in remembered),
        after="removed",
        note=why,
    )


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    leftovers = _still_listed(ours(facts), facts.snapshot.mtrr)
    return Planned(steps=[_remove_step(leftovers, "teardown removes only the entries setup added")]
                   if leftovers else [])


def observe(host: Host, target: SetupTarget, facts: SetupFacts) -> None:
    facts.boot_id = boot_id(host)
    facts.mtrr_count = variable_mtrr_count(host)


# --- applying: the state file remembers each register added, with the boot it belongs to -------------
def add(ctx: ApplyContext, action: MtrrAdd) -> str:
    current_boot = boot_id(ctx.host)
    if ctx.state.get("boot_id") != current_boot:
        ctx.state["mtrr"] = []  # entries remembered from an earlier boot died with it
        ctx.state["boot_id"] = current_boot
    entry = add_mtrr(ctx.host, action.base, action.size, action.type)
    ctx.state.setdefault("mtrr", []).append({"reg": entry.reg, "base": entry.base, "size": entry.size})
    return f"reg{entry.reg:02d} base=0x{entry.base:x} size=0x{entry.size:x}"


def remove(ctx: ApplyContext, action: MtrrRemove) -> str:
    listed = read_mtrr(ctx.host) or []
    if not any(e.reg == action.reg and e.base == action.base and e.size == action.size for e in listed):
        raise StepFailed(
            f"MTRR reg{action.reg:02d} no longer holds base=0x{action.base:x} size=0x{action.size:x}",
            why="someone changed /proc/mtrr since setup; nothing was removed",
            fix="inspect `cat /proc/mtrr` and remove entries by hand if they are belugactl's",
        )
    remove_mtrr(ctx.host, action.reg)
    ctx.state["mtrr"] = [m for m in ctx.state.get("mtrr", []) if m["reg"] != action.reg]
    return f"reg{action.reg:02d} removed"


TOPIC = SetupTopic(
    id=ID,
    order=80,
    summary="an uncachable MTRR over the pool's physical range",
    plan=plan,
    teardown=teardown,
    observe=observe,
    executors={MtrrAdd: add, MtrrRemove: remove},
    changes=frozenset({"mtrr"}),
)
