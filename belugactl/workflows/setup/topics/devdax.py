"""The pool's devdax device: a map=mem devdax namespace on a pmem region, or a dax device taken back
from the page allocator (ram regions, firmware-provisioned pools).

map=mem keeps the page metadata in host RAM: with map=dev every host would write its own metadata
into the same shared bytes. A dax device onlined as system RAM is turned back into devdax with
`daxctl reconfigure-device`, and never while its memory is in use unless forced. The device must
hold the manifest's pool.size: the layout's partitions are offsets into it.
"""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem, InputError
from belugactl.host.snapshot import NdNamespace
from belugactl.model.setup_plan import RunCommand, Step
from belugactl.units import format_size
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.pool_lookup import find_pool_namespace, find_pool_region, nd_region_for, pool_dax
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State, record_created

ID = "devdax"


def align_arg(align: int) -> str:
    """ndctl's spelling of an alignment (2M, 1G)."""
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if align % factor == 0:
            return f"{align // factor}{unit}"
    return str(align)


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    _require_fit(target, facts)
    pool = target.pool
    if pool.source == "cxl-region" and pool.region_type == "pmem":
        return Planned(steps=_plan_namespace(target, facts))
    return Planned(steps=_plan_reconfigure(target, facts))


def _require_fit(target: SetupTarget, facts: SetupFacts) -> None:
    """Refuse a pool larger than the device it is on (only doctor noticed before: a plan went ahead)."""
    want = target.pool.size
    dax = pool_dax(target, facts)
    if dax is not None and dax.size is not None:
        have, what = dax.size, f"the pool's dax device {dax.name}"
    else:
        region = find_pool_region(target, facts)
        if region is None or region.size is None:
            return
        have, what = region.size, f"the pool's CXL region {region.name}"
    if have >= want:
        return
    exact = format_size(have)
    spelled = exact.replace(" ", "") if "." not in exact else str(have)
    raise InputError(
        f"pool.size is {format_size(want)}, but {what} on this host is {format_size(have)}",
        why=f"the layout is built on pool.size: everything past {format_size(have)} "
        "(partitions, shared KV) would lie beyond the end of the device",
        fix=f"set pool.size: {spelled} in the manifest (every host must agree), "
        "or point pool.source at the device the pool was sized for",
    )


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


def _plan_namespace(target: SetupTarget, facts: SetupFacts) -> list[Step]:
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
        return _fix_namespace(target, ns)
    if region is None:
        return [_create_later(f"create devdax namespace {pool.namespace_name} on the new region",
                              "<nd region of the new CXL region>", target,
                              "the nd region name is known once the CXL region exists")]
    nd_region = nd_region_for(region, facts)
    if nd_region is None:
        return [_create_later(f"create devdax namespace {pool.namespace_name} on {region.name}",
                              f"<nd region of {region.name}>", target,
                              f"the nvdimm region for {region.name} is not visible yet (is cxl_pmem loaded?)")]
    # A namespace on that region with another uuid holds someone's data: replacing it is destructive.
    others = [n for n in facts.snapshot.nd.namespaces if n.region == nd_region and (n.size or 0) > 0]
    if others:
        other = others[0]
        return [
            Step(
                id="devdax.reconfigure",
                topic=ID,
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
            topic=ID,
            summary=f"create devdax namespace {pool.namespace_name} on {nd_region} ({region.name})",
            actions=(RunCommand(_namespace_argv(target, nd_region)),),
            before="no namespace with the pool's uuid",
            after=f"devdax, map mem, align {format_size(pool.align)}",
        )
    ]


def _create_later(summary: str, nd_region: str, target: SetupTarget, note: str) -> Step:
    return Step(
        id="devdax.create",
        topic=ID,
        summary=summary,
        actions=(RunCommand(_namespace_argv(target, nd_region)),),
        deferred=True,
        note=note,
    )


def _fix_namespace(target: SetupTarget, ns: NdNamespace) -> list[Step]:
    """The pool's namespace exists: nothing to do, finish an interrupted create, or re-create it."""
    pool = target.pool
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
                topic=ID,
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
            topic=ID,
            summary=f"reconfigure {ns.dev} as a map=mem devdax namespace",
            actions=_recreate_actions(target, ns),
            destroys_data=True,
            before=", ".join(wrong),
            after=f"devdax, map mem, align {format_size(pool.align)}",
            note="re-creating the namespace discards what the pool holds for this host's view",
        )
    ]


def _plan_reconfigure(target: SetupTarget, facts: SetupFacts) -> list[Step]:
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
                topic=ID,
                summary="make the new region's dax device a devdax device",
                deferred=True,
                note="the dax device appears once the region exists",
            )
        ]
    if dax.mode != "system-ram":
        if dax.state != "disabled":
            return []
        # A new ram region's dax device with kmem not loaded: no driver, no usable /dev node.
        return [
            Step(
                id="devdax.reconfigure",
                topic=ID,
                summary=f"bind {dax.name} to device_dax (the region's dax device has no driver yet)",
                actions=(RunCommand(("daxctl", "reconfigure-device", "--mode=devdax", dax.name)),),
                before="no driver (daxctl: state disabled)",
                after="devdax",
            )
        ]
    online = dax.online_memblocks or 0
    argv = ["daxctl", "reconfigure-device", "--mode=devdax"] + (["--force"] if online else []) + [dax.name]
    return [
        Step(
            id="devdax.reconfigure",
            topic=ID,
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


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    namespace = facts.state.get("created", {}).get("namespace")
    if not namespace or not any(n.dev == namespace for n in facts.snapshot.nd.namespaces):
        return Planned()
    return Planned(steps=[
        Step(
            id="devdax.destroy",
            topic=ID,
            summary=f"destroy namespace {namespace} (the pool's devdax device on this host)",
            actions=(RunCommand(("ndctl", "destroy-namespace", "-f", namespace)),),
            destroys_data=True,
            note="this host loses the pool and what it holds; other hosts keep their own namespaces",
        )
    ])


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    record_created(state, verb, "namespace", lambda: getattr(find_pool_namespace(target, facts), "dev", None))


TOPIC = SetupTopic(
    id=ID,
    order=20,
    summary="the pool's devdax device (a map=mem namespace, or a dax device taken back from system RAM)",
    plan=plan,
    teardown=teardown,
    survives_reboot=True,
    record=record,
)
