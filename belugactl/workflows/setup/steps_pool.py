"""Pool steps: the CXL region, the devdax device on it, and the device's permissions.

pmem (the lab, ndctl 76): `cxl create-region -t pmem` -> nvdimm region -> `ndctl create-namespace
-m devdax -M mem`. map=mem keeps the page metadata in host RAM: with map=dev every host would
write its own metadata into the same shared bytes. ram regions and firmware-provisioned memory
arrive as a dax device that may be onlined as system RAM; it is turned back into devdax with
`daxctl reconfigure-device`, and never while its memory is in use unless forced.
"""

from __future__ import annotations

import re

from belugactl.errors import EnvironmentProblem, InputError
from belugactl.host.snapshot import CxlRegion, DaxDevice, NdNamespace
from belugactl.host.write_udev import RULE_FILE, rule_text
from belugactl.model.plan import RunCommand, SetOwnership, Skip, Step, WriteFile
from belugactl.pool.device import device_path
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget

# ram regions: `cxl create-region -t ram` arrived in ndctl v77 and create_ram_region in kernel 6.3.
RAM_MIN_NDCTL = 77
RAM_MIN_KERNEL = (6, 3)


def kernel_version(release: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m[1]), int(m[2])) if m else None


def align_arg(align: int) -> str:
    """ndctl's spelling of an alignment (2M, 1G)."""
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if align % factor == 0:
            return f"{align // factor}{unit}"
    return str(align)


# --- lookups -------------------------------------------------------------------------------------
def pool_memdevs(target: SetupTarget, facts: SetupFacts) -> list[str]:
    cxl = facts.snapshot.cxl
    serials = target.pool.memdev_serials
    if serials is None:
        wanted_ram = target.pool.region_type == "ram"
        names = [
            m.name
            for m in cxl.memdevs
            if m.state != "disabled" and ((m.ram_size or 0) if wanted_ram else (m.pmem_size or 0)) > 0
        ]
        return sorted(names, key=_natural)
    by_serial = {str(m.serial): m.name for m in cxl.memdevs if m.serial is not None}
    by_serial.update({hex(m.serial): m.name for m in cxl.memdevs if m.serial is not None})
    missing = [s for s in serials if s not in by_serial]
    if missing:
        found = ", ".join(f"{m.name} (serial {m.serial})" for m in cxl.memdevs) or "none"
        raise EnvironmentProblem(
            f"memdev serial(s) {', '.join(missing)} named in the manifest are not on this host",
            why=f"memdevs present: {found}",
            fix="check cabling and `cxl list -M`, or correct pool.source.memdevs",
        )
    return [by_serial[s] for s in serials]


def _natural(name: str) -> tuple[str, int]:
    m = re.match(r"(\D*)(\d+)", name)
    return (m[1], int(m[2])) if m else (name, -1)


def find_pool_region(target: SetupTarget, facts: SetupFacts) -> CxlRegion | None:
    if target.pool.source != "cxl-region":
        return None
    memdevs = set(pool_memdevs(target, facts))
    created = facts.state.get("created", {}).get("region")
    for region in facts.snapshot.cxl.regions:
        if memdevs and set(region.memdevs) == memdevs:
            return region
    # Older tool versions may not list mappings; the region setup created is then known by name.
    return facts.snapshot.cxl.region(created) if created else None


def find_pool_namespace(target: SetupTarget, facts: SetupFacts) -> NdNamespace | None:
    uuid = (target.pool.namespace_uuid or "").lower()
    if not uuid:
        return None
    spaces = facts.snapshot.nd.namespaces
    # The label uuid is the one `create-namespace -u` pinned (discovery reads it from sysfs); ndctl's
    # "uuid" for a devdax namespace is the info block's, so it matches only raw namespaces.
    by_label = [n for n in spaces if n.label_uuid == uuid or (n.uuid or "").lower() == uuid]
    if by_label:
        return by_label[0]
    # Without the label uuid (no sysfs access), the pinned name identifies it.
    return next(
        (n for n in spaces if n.label_uuid is None and n.name and n.name == target.pool.namespace_name),
        None,
    )


def pool_dax_device(target: SetupTarget, facts: SetupFacts) -> str | None:
    """The pool's dax device name ("dax0.0") once it exists."""
    if target.pool.source == "dax-device":
        return target.pool.dax_device if facts.snapshot.dax_device(target.pool.dax_device or "") else None
    if target.pool.region_type == "pmem":
        ns = find_pool_namespace(target, facts)
        return ns.chardev if ns is not None and ns.mode == "devdax" else None
    region = find_pool_region(target, facts)
    if region is None:
        return None
    # A ram region's dax region carries the region's number (dax_region id == region id).
    number = region.name.removeprefix("region")
    found = [d for d in facts.snapshot.dax if d.name.startswith(f"dax{number}.")]
    return found[0].name if found else None


def pool_dax(target: SetupTarget, facts: SetupFacts) -> DaxDevice | None:
    name = pool_dax_device(target, facts)
    return facts.snapshot.dax_device(name) if name else None


def nd_region_for(region: CxlRegion, facts: SetupFacts) -> str | None:
    """The libnvdimm region a CXL pmem region appears as (separate id spaces: match by size)."""
    candidates = [r for r in facts.snapshot.nd.regions if (r.provider or "CXL") == "CXL"]
    sized = [r for r in candidates if region.size is not None and r.size == region.size]
    pick = sized or (candidates if len(candidates) == 1 else [])
    return pick[0].dev if len(pick) == 1 else None


# --- region --------------------------------------------------------------------------------------
def plan_region(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    pool = target.pool
    if pool.source != "cxl-region":
        return [], [Skip("region", f"the pool is the existing dax device {pool.dax_device}")]
    if find_pool_region(target, facts) is not None:
        return [], []
    snap = facts.snapshot
    if pool.region_type == "ram":
        cxl = snap.tool("cxl")
        kernel = kernel_version(snap.kernel.release)
        if (cxl.major or 0) < RAM_MIN_NDCTL or kernel is None or kernel < RAM_MIN_KERNEL:
            raise EnvironmentProblem(
                "this host cannot create a ram (volatile) CXL region",
                why=f"ram regions need ndctl >= {RAM_MIN_NDCTL} and kernel >= 6.3; this host has "
                f"cxl {cxl.version or 'missing'} and kernel {snap.kernel.release or 'unknown'}",
                fix="upgrade ndctl and the kernel, or use a pmem pool (pool.source.type: pmem)",
            )
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
        topic="region",
        summary=f"create a {pool.region_type} CXL region on {', '.join(memdevs)} through {decoder}",
        actions=(RunCommand(tuple(argv)),),
        before="no region on these memdevs",
        after=f"{pool.region_type} region, {ways} way(s)",
    )
    return [step], []


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
    return sorted(roomy, key=lambda d: _natural(d.name.replace(".", "")))[0].name


# --- devdax ----------------------------------------------------------------------------------------
def plan_devdax(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    pool = target.pool
    if pool.source == "cxl-region" and pool.region_type == "pmem":
        return _plan_namespace(target, facts, force), []
    return _plan_reconfigure(target, facts, force), []


def _recreate_actions(target: SetupTarget, ns: NdNamespace) -> tuple[RunCommand, ...]:
    """Re-create the pool's own namespace (it already bears the pool's uuid): destroy, then create.

    Not `ndctl create-namespace -f -e NS -u UUID`: ndctl makes the new namespace in the region's seed
    while NS still holds UUID, and the kernel refuses a second namespace with the same uuid
    ("set_uuid failed: Invalid argument", ndctl 76.1 on kernel 6.1, found in the lab); without -u
    the label uuid would be random. A crash between the two commands leaves no namespace, which the
    next setup creates.
    """
    if ns.region is None:
        return (RunCommand(_namespace_argv(target, "", reconfig=ns.dev)),)
    return (
        RunCommand(("ndctl", "destroy-namespace", "-f", ns.dev)),
        RunCommand(_namespace_argv(target, ns.region)),
    )


def _namespace_argv(target: SetupTarget, nd_region: str, *, reconfig: str | None = None) -> tuple[str, ...]:
    pool = target.pool
    argv = ["ndctl", "create-namespace"]
    if reconfig:
        argv += ["-f", "-e", reconfig]
    argv += ["-m", "devdax", "-M", "mem", "-a", align_arg(pool.align)]
    argv += ["-u", str(pool.namespace_uuid), "-n", str(pool.namespace_name)]
    if not reconfig:
        argv += ["-r", nd_region]
    return tuple(argv)


def _plan_namespace(target: SetupTarget, facts: SetupFacts, force: bool) -> list[Step]:
    pool = target.pool
    if not pool.namespace_uuid or not pool.namespace_name:
        raise InputError(
            "a pmem pool needs pool.namespace.uuid and pool.namespace.name",
            why="every host must create the same namespace, so the manifest pins them",
            fix="add them (uuidgen prints a uuid)",
        )
    ns = find_pool_namespace(target, facts)
    region = find_pool_region(target, facts)
    if ns is not None:
        wrong = []
        if ns.mode != "devdax":
            wrong.append(f"mode {ns.mode} (want devdax)")
        if ns.map not in (None, "mem"):
            wrong.append(f"map {ns.map} (want mem)")
        if ns.align is not None and ns.align != pool.align:
            wrong.append(f"align {format_size(ns.align)} (want {format_size(pool.align)})")
        if ns.name is not None and ns.name != pool.namespace_name:
            wrong.append(f"name {ns.name} (want {pool.namespace_name})")
        if not wrong:
            return []
        if ns.mode == "raw" and wrong == ["mode raw (want devdax)"] and ns.name == pool.namespace_name:
            # Setup never makes a raw namespace. One with the pool's uuid and name is what a host that
            # died inside `ndctl create-namespace -m devdax` leaves (found in the lab): the labels are
            # written, the devdax info block is not. No devdax view of it ever existed on this host,
            # and with map=mem finishing writes only the info block in the first 2 MiB the layout
            # reserves for it (what devdax.create writes too), so it needs no --force.
            return [
                Step(
                    id="devdax.reconfigure",
                    topic="devdax",
                    summary=f"finish creating the pool's devdax namespace on {ns.dev} (left raw by an "
                    "interrupted create)",
                    actions=_recreate_actions(target, ns),
                    before=f"{ns.dev}: raw, uuid and name of the pool's namespace, no devdax info block",
                    after=f"devdax, map mem, align {format_size(pool.align)}",
                )
            ]
        return [
            Step(
                id="devdax.reconfigure",
                topic="devdax",
                summary=f"reconfigure {ns.dev} as a map=mem devdax namespace",
                actions=_recreate_actions(target, ns),
                destroys_data=True,
                before=", ".join(wrong),
                after=f"devdax, map mem, align {format_size(pool.align)}",
                note="re-creating the namespace discards what the pool holds for this host's view",
            )
        ]
    if region is None:
        return [
            Step(
                id="devdax.create",
                topic="devdax",
                summary=f"create devdax namespace {pool.namespace_name} on the new region",
                actions=(RunCommand(_namespace_argv(target, "<nd region of the new CXL region>")),),
                deferred=True,
                note="the nd region name is known once the CXL region exists",
            )
        ]
    nd_region = nd_region_for(region, facts)
    if nd_region is None:
        return [
            Step(
                id="devdax.create",
                topic="devdax",
                summary=f"create devdax namespace {pool.namespace_name} on {region.name}",
                actions=(RunCommand(_namespace_argv(target, f"<nd region of {region.name}>")),),
                deferred=True,
                note=f"the nvdimm region for {region.name} is not visible yet (is cxl_pmem loaded?)",
            )
        ]
    # A namespace on that region with another uuid holds someone's data: replacing it is destructive.
    others = [n for n in facts.snapshot.nd.namespaces if n.region == nd_region and (n.size or 0) > 0]
    if others:
        other = others[0]
        return [
            Step(
                id="devdax.reconfigure",
                topic="devdax",
                summary=f"replace namespace {other.dev} ({other.name or 'unnamed'}) with the pool's namespace",
                actions=(RunCommand(_namespace_argv(target, nd_region, reconfig=other.dev)),),
                destroys_data=True,
                before=f"{other.dev}: {other.mode}, name {other.name}, "
                f"uuid {other.label_uuid or '?'}",
                after=f"devdax, uuid {pool.namespace_uuid}",
                note="the manifest pins another uuid; the existing namespace's contents are discarded",
            )
        ]
    return [
        Step(
            id="devdax.create",
            topic="devdax",
            summary=f"create devdax namespace {pool.namespace_name} on {nd_region} ({region.name})",
            actions=(RunCommand(_namespace_argv(target, nd_region)),),
            before="no namespace with the pool's uuid",
            after=f"devdax, map mem, align {format_size(pool.align)}",
        )
    ]


def _plan_reconfigure(target: SetupTarget, facts: SetupFacts, force: bool) -> list[Step]:
    dax = pool_dax(target, facts)
    if dax is None:
        if target.pool.source == "dax-device":
            raise EnvironmentProblem(
                f"the pool's dax device {target.pool.dax_device} is not on this host",
                why="`daxctl list` does not show it",
                fix="check the firmware's memory reservation and that device_dax/kmem are loaded",
            )
        return [
            Step(
                id="devdax.reconfigure",
                topic="devdax",
                summary="make the new region's dax device a devdax device",
                deferred=True,
                note="the dax device appears once the region exists",
            )
        ]
    if dax.mode != "system-ram":
        return []
    online = dax.online_memblocks or 0
    argv = ["daxctl", "reconfigure-device", "--mode=devdax"] + (["--force"] if online else []) + [dax.name]
    return [
        Step(
            id="devdax.reconfigure",
            topic="devdax",
            summary=f"take {dax.name} back from the page allocator as a devdax device",
            actions=(RunCommand(tuple(argv)),),
            destroys_data=online > 0,
            before=f"system-ram, {online} of {dax.total_memblocks or '?'} memory blocks online",
            after="devdax",
            note=(
                f"{online} memory block(s) are online: processes may be using that memory; "
                "offlining it needs --force and can fail while pages are pinned"
                if online
                else None
            ),
        )
    ]


# --- permissions -------------------------------------------------------------------------------
def plan_permissions(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    dax = pool_dax(target, facts)
    perms = target.permissions
    if dax is None:
        return [
            Step(
                id="permissions.dax",
                topic="permissions",
                summary=f"udev rule and {perms.owner}:{perms.group} {perms.mode:04o} for the pool's dax device",
                deferred=True,
                note="the device name is known once it exists",
            )
        ], []
    device = device_path(dax.name)
    text = rule_text(device, perms.owner, perms.group, perms.mode)
    actions: list = []
    before = []
    current_rule = facts.udev_rule
    if current_rule != text:
        actions.append(WriteFile(RULE_FILE, text))
        before.append("no matching udev rule" if current_rule is None else "a different udev rule")
    owner_ok = dax.dev_owner == perms.owner or (perms.owner.isdigit() and str(dax.dev_uid) == perms.owner)
    group_ok = dax.dev_group == perms.group or (perms.group.isdigit() and str(dax.dev_gid) == perms.group)
    mode_ok = dax.dev_mode is not None and (dax.dev_mode & 0o7777) == perms.mode
    if dax.dev_exists and not (owner_ok and group_ok and mode_ok):
        actions.append(SetOwnership(device, perms.owner, perms.group, perms.mode))
        mode = f"{dax.dev_mode & 0o7777:04o}" if dax.dev_mode is not None else "?"
        before.append(f"{device} is {dax.dev_owner or dax.dev_uid}:{dax.dev_group or dax.dev_gid} {mode}")
    if not actions:
        return [], []
    return [
        Step(
            id="permissions.dax",
            topic="permissions",
            summary=f"{device} owned by {perms.owner}:{perms.group}, mode {perms.mode:04o} (now and at every boot)",
            actions=tuple(actions),
            before="; ".join(before),
            after=f"{perms.owner}:{perms.group} {perms.mode:04o}",
        )
    ], []
