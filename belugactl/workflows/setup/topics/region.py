"""The CXL region the pool lives on: created from the pool's memdevs, destroyed by teardown.

pmem (the lab, ndctl 76): `cxl create-region -t pmem`, then the devdax topic makes a namespace on
it. ram regions need ndctl >= 77 and kernel >= 6.3 (`create_ram_region`). A pool that is an
existing dax device (firmware-provisioned) has no region for setup to make.
"""

from __future__ import annotations

import re

from belugactl.errors import EnvironmentProblem, InputError
from belugactl.model.setup_plan import RunCommand, Skip, Step
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.pool_lookup import find_pool_region, natural_key, pool_memdevs
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State, record_created

ID = "region"
RAM_MIN_NDCTL = 77
RAM_MIN_KERNEL = (6, 3)


def kernel_version(release: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m[1]), int(m[2])) if m else None


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    pool = target.pool
    if pool.source != "cxl-region":
        return Planned(skipped=[Skip(ID, f"the pool is the existing dax device {pool.dax_device}")])
    if find_pool_region(target, facts) is not None:
        return Planned()
    snap = facts.snapshot
    if pool.region_type == "ram":
        _require_ram_support(facts)
    if pool.interleave_mode != "hardware":
        raise InputError(
            "setup builds one hardware-interleaved region; software interleave across devices is not planned yet",
            fix="use pool.interleave.mode: hardware, or provision the regions by hand and use a dax-device source",
        )
    memdevs = pool_memdevs(target, facts)
    if not memdevs:
        raise EnvironmentProblem(
            "no CXL memory device with capacity of the pool's type on this host",
            why=f"`cxl list -M` shows {len(snap.cxl.memdevs)} memdev(s) with no {pool.region_type} capacity",
            fix="check `cxl list -M` and that cxl_pci/cxl_mem are loaded",
        )
    _require_capacity(target, facts, memdevs)
    ways = pool.ways if pool.ways > 1 else len(memdevs)
    if ways != len(memdevs):
        raise InputError(
            f"pool.interleave.ways is {pool.ways} but the pool has {len(memdevs)} memdev(s): {', '.join(memdevs)}",
            fix="make ways equal the number of memdevs",
        )
    decoder = choose_root_decoder(target, facts)
    argv = ["cxl", "create-region", "-m", "-d", decoder, "-w", str(ways), "-t", pool.region_type]
    if pool.granularity:
        argv += ["-g", str(pool.granularity)]
    if pool.region_size:
        argv += ["-s", str(pool.region_size)]
    argv += memdevs
    step = Step(
        id="region.create",
        topic=ID,
        summary=f"create a {pool.region_type} CXL region on {', '.join(memdevs)} through {decoder}",
        actions=(RunCommand(tuple(argv)),),
        before="no region on these memdevs",
        after=f"{pool.region_type} region, {ways} way(s)",
    )
    return Planned(steps=[step])


def _require_ram_support(facts: SetupFacts) -> None:
    snap = facts.snapshot
    cxl = snap.tool("cxl")
    kernel = kernel_version(snap.kernel.release)
    # A version that could not be read (a query that timed out on a loaded host, seen in the lab)
    # is not an old version: then the kernel decides, and `cxl create-region -t ram` itself says
    # so if the tool cannot do it. Refuse only what is known: no tool, an old tool, an old kernel.
    unreadable = cxl.installed and cxl.major is None and cxl.error is not None
    too_old_tool = not cxl.installed or (not unreadable and (cxl.major or 0) < RAM_MIN_NDCTL)
    old_kernel = kernel is None or kernel < RAM_MIN_KERNEL
    if too_old_tool or old_kernel:
        # Name only what is lacking: a 6.18 kernel needs no upgrade, whatever ndctl is.
        lacking = (["ndctl"] if too_old_tool else []) + (["the kernel"] if old_kernel else [])
        want = ([f"ndctl >= {RAM_MIN_NDCTL}"] if too_old_tool else []) + (
            [f"kernel >= {'.'.join(map(str, RAM_MIN_KERNEL))}"] if old_kernel else [])
        raise EnvironmentProblem(
            "this host cannot create a ram (volatile) CXL region",
            why=f"ram regions need ndctl >= {RAM_MIN_NDCTL} and kernel >= 6.3; this host has "
            f"cxl {cxl.version or 'missing'} and kernel {snap.kernel.release or 'unknown'}",
            fix=f"upgrade {' and '.join(lacking)} (to {' and '.join(want)}), "
            "or use a pmem pool (pool.source.type: pmem)",
        )


def _require_capacity(target: SetupTarget, facts: SetupFacts, memdevs: list[str]) -> None:
    """The manifest's pool must fit the memdevs it is built from (a plan for 8 TiB on 512 GiB is refused)."""
    pool = target.pool
    by_name = {m.name: m for m in facts.snapshot.cxl.memdevs}
    sizes = [(by_name[n].ram_size if pool.region_type == "ram" else by_name[n].pmem_size) for n in memdevs]
    if any(s is None for s in sizes):
        return  # a size the tools did not report: the region step itself finds out
    capacity = sum(s or 0 for s in sizes)
    need = max(pool.size, pool.region_size or 0)
    if capacity < need:
        what = "pool.source.region_size" if (pool.region_size or 0) > pool.size else "pool.size"
        raise InputError(
            f"{what} is {format_size(need)}, but the pool's memdev(s) on this host hold {format_size(capacity)}",
            why=f"{pool.region_type} capacity: " + ", ".join(
                f"{n} {format_size(s or 0)}" for n, s in zip(memdevs, sizes, strict=True)),
            fix=f"set {what} to at most {format_size(capacity)} in the manifest (every host must agree), "
            "or add memory devices to the pool",
        )


def choose_root_decoder(target: SetupTarget, facts: SetupFacts) -> str:
    pool = target.pool
    roots = facts.snapshot.cxl.root_decoders
    if pool.decoder:
        if not any(d.name == pool.decoder for d in roots):
            raise EnvironmentProblem(
                f"root decoder {pool.decoder} named in the manifest is not on this host",
                why="root decoders: " + (", ".join(d.name for d in roots) or "none"),
                fix="correct pool.source.decoder or drop it to let setup choose",
            )
        return pool.decoder
    need = pool.region_size or pool.size
    capable = [d for d in roots if (d.volatile_capable if pool.region_type == "ram" else d.pmem_capable)]
    roomy = [d for d in capable if d.max_available_extent is None or d.max_available_extent >= need]
    if not roomy:
        seen = ", ".join(
            f"{d.name} (pmem={bool(d.pmem_capable)}, ram={bool(d.volatile_capable)}, "
            f"free {format_size(d.max_available_extent or 0)})"
            for d in roots
        )
        raise EnvironmentProblem(
            f"no root decoder can hold a {format_size(need)} {pool.region_type} region",
            why="root decoders: " + (seen or "none (is cxl_acpi loaded? does the firmware describe a CFMWS?)"),
            fix="free capacity (`cxl destroy-region`), or pin pool.source.decoder",
        )
    return sorted(roomy, key=lambda d: natural_key(d.name.replace(".", "")))[0].name


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    region = facts.state.get("created", {}).get("region")
    if not region or facts.snapshot.cxl.region(region) is None:
        return Planned()
    return Planned(steps=[
        Step(
            id="region.destroy",
            topic=ID,
            summary=f"destroy CXL region {region}",
            actions=(RunCommand(("cxl", "destroy-region", "-f", region)),),
            destroys_data=True,
            note="the pool content is unreachable from this host afterwards",
        )
    ])


def discovery(target: SetupTarget, state: State) -> frozenset[str]:
    # Tool versions only for a ram region (refused below ndctl 77).
    pool = getattr(target, "pool", None)
    ram_region = pool is not None and pool.source == "cxl-region" and pool.region_type == "ram"
    return frozenset({"tools"}) if ram_region else frozenset()


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    record_created(state, verb, "region", lambda: getattr(find_pool_region(target, facts), "name", None))


TOPIC = SetupTopic(
    id=ID,
    order=10,
    summary="the CXL region the pool lives on",
    plan=plan,
    teardown=teardown,
    survives_reboot=True,
    discovery=discovery,
    record=record,
)
