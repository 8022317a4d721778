"""The pool's device-dax device: present, devdax (never system-ram), map=mem, align, size, identity, access."""

from __future__ import annotations

import stat

from belugactl.host.snapshot import DaxDevice, NdNamespace
from belugactl.pool.device import device_path
from belugactl.units import MiB, format_size
from belugactl.workflows.doctor.checks.common import manifest_arg, setup_fix, skip_without_cxl, skip_without_manifest
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult

DEFAULT_ALIGN = 2 * MiB
UDEV_RULE = '/etc/udev/rules.d/60-beluga-dax.rules: SUBSYSTEM=="dax", KERNEL=="{name}", GROUP="beluga", MODE="0660"'


def _pool_or_skip(ctx: DoctorContext) -> DaxDevice | CheckResult:
    """The pool's dax device, or the skip/fail that says why there is none to check."""
    if (skip := skip_without_cxl(ctx) or skip_without_manifest(ctx)) is not None:
        return skip
    dev = ctx.pool_dax()
    if dev is not None:
        return dev
    return CheckResult.skip("no pool dax device found (see dax.device-present)")


def _namespace_of(ctx: DoctorContext, dev: DaxDevice) -> NdNamespace | None:
    return next((ns for ns in ctx.snapshot.nd.namespaces if ns.chardev == dev.name), None)


def _reconfig_cmd(ctx: DoctorContext, ns: NdNamespace) -> str:
    exp = ctx.expect
    align = (
        format_size(exp.align if exp is not None and exp.align else DEFAULT_ALIGN).replace(" ", "").replace("iB", "")
    )
    ident = ""
    if exp is not None and exp.namespace_uuid:
        ident = f" -u {exp.namespace_uuid} -n {exp.namespace_name}"
    return f"ndctl create-namespace --force --reconfig={ns.dev} -m devdax -M mem -a {align}{ident}"


@REGISTRY.check("dax.device-present", "the pool's dax device and its /dev node exist")
def device_present(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx) or skip_without_manifest(ctx)) is not None:
        return skip
    exp = ctx.expect
    assert exp is not None  # skip_without_manifest
    dev = ctx.pool_dax()
    if dev is None:
        if exp.dax_device:
            return CheckResult.fail(f"the manifest's dax device {exp.dax_device} does not exist", setup_fix(ctx))
        cxl_dax = ctx.cxl_dax_devices()
        if len(cxl_dax) > 1:
            return CheckResult.warn(
                f"several CXL dax devices ({', '.join(d.name for d in cxl_dax)}); which one is the pool is unclear",
                "name it in the manifest (pool.source.device) or destroy the extra ones",
            )
        return CheckResult.fail("no dax device on the CXL memory yet: the pool is not set up", setup_fix(ctx))
    if dev.mode == "system-ram":
        return CheckResult.skip(f"{dev.name} is onlined as system-ram, so it has no /dev node (see dax.mode-devdax)")
    if not dev.dev_exists:
        return CheckResult.fail(
            f"{dev.name} exists in sysfs but {dev.dev_path or '/dev/' + dev.name} does not",
            f"udevadm trigger --subsystem-match=dax --action=add (or `daxctl enable-device {dev.name}`)",
        )
    return CheckResult.ok(f"{dev.dev_path or '/dev/' + dev.name} ({format_size(dev.size or 0)})", device=dev.name)


@REGISTRY.check(
    "dax.mode-devdax", "CXL dax devices are devdax, never onlined as system-ram", guards_data=True
)
def mode_devdax(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx)) is not None:
        return skip
    devices = ctx.cxl_dax_devices()
    pool = ctx.pool_dax()
    if pool is not None and pool not in devices:
        devices.append(pool)
    if not devices:
        return CheckResult.skip("no dax device on CXL memory (see dax.device-present)")
    ram = [d for d in devices if d.mode == "system-ram"]
    if ram:
        described = ", ".join(
            f"{d.name} (node {d.target_node if d.target_node is not None else '?'}"
            + (f", {d.online_memblocks}/{d.total_memblocks} blocks online" if d.total_memblocks else "")
            + _zone(d)
            + ")"
            for d in ram
        )
        pinned = any(d.movable is False for d in ram)
        cmds = "; ".join(f"daxctl reconfigure-device --mode=devdax --force {d.name}" for d in ram)
        return CheckResult.fail(
            f"{described} onlined as system-ram: the kernel has claimed the pool as ordinary memory "
            "(onlining zeroes it) and will hand it to any process, overwriting what other hosts store there",
            f"stop what runs on that node, then {cmds} (offlines the memory"
            + ("; ZONE_NORMAL memory holds kernel allocations, so offlining can fail: then reboot with "
               "memhp_default_state=offline and kmem blacklisted (`belugactl setup` plans both)"
               if pinned else "; if that fails it is in use: reboot with memhp_default_state=offline")
            + "); then echo offline > /sys/devices/system/memory/auto_online_blocks (see memory.auto-online) "
            f"and re-verify the pool header with `belugactl doctor -f {manifest_arg(ctx)}`",
            devices=[d.name for d in ram],
        )
    unknown = [d.name for d in devices if d.mode is None]
    if unknown:
        return CheckResult.warn(
            f"mode of {', '.join(unknown)} unknown (neither daxctl nor the driver link said)",
            "check with `daxctl list`",
        )
    return CheckResult.ok("devdax: " + ", ".join(d.name for d in devices))


def _zone(d: DaxDevice) -> str:
    """Where onlined memory went: ZONE_NORMAL takes kernel allocations, ZONE_MOVABLE only movable pages."""
    if d.movable is None:
        return ""
    return ", ZONE_MOVABLE (movable)" if d.movable else ", ZONE_NORMAL (not movable)"


@REGISTRY.check(
    "dax.map-mem", "the pool's devdax namespace keeps page metadata in RAM (map=mem)", guards_data=True
)
def map_mem(ctx: DoctorContext) -> CheckResult:
    dev = _pool_or_skip(ctx)
    if isinstance(dev, CheckResult):
        return dev
    ns = _namespace_of(ctx, dev)
    if ns is None:
        return CheckResult.skip(
            f"{dev.name} has no libnvdimm namespace (ram region or firmware memory): "
            "no page-metadata placement to choose"
        )
    if ns.map in (None, "mem", "none"):
        if ns.map is None:
            return CheckResult.warn(f"{ns.dev}: map not reported", f"check with `ndctl list -n {ns.dev}`")
        return CheckResult.ok(f"{ns.dev} map={ns.map}")
    shared = ctx.expect is not None and ctx.expect.hosts_sharing > 1
    reason = f"{ns.dev} ({dev.name}) has map=dev: the kernel keeps its per-page metadata on the pool media itself"
    fix = _reconfig_cmd(ctx, ns) + " (destroys the namespace's view of the pool; coordinate with the other hosts)"
    if shared:
        return CheckResult.fail(
            reason
            + f"; {ctx.expect.hosts_sharing} hosts share this pool, so each writes its metadata into the same bytes",  # type: ignore[union-attr]
            fix,
        )
    return CheckResult.warn(
        reason + "; safe only if no other host maps this pool (Beluga pools are shared)",
        fix,
    )


@REGISTRY.check("dax.align", "the pool's dax device alignment (2 MiB or the manifest's)")
def align(ctx: DoctorContext) -> CheckResult:
    dev = _pool_or_skip(ctx)
    if isinstance(dev, CheckResult):
        return dev
    if dev.align is None:
        return CheckResult.skip(f"{dev.name}: align not reported")
    want = ctx.expect.align if ctx.expect is not None and ctx.expect.align else None
    ns = _namespace_of(ctx, dev)
    fix = (
        _reconfig_cmd(ctx, ns)
        if ns is not None
        else f"daxctl reconfigure-device --mode=devdax --force --align=2M {dev.name}"
    )
    if want is not None and dev.align != want:
        return CheckResult.fail(
            f"{dev.name} align {format_size(dev.align)}, the manifest says {format_size(want)}: "
            "offsets and mmap lengths would not line up across hosts",
            fix,
        )
    if want is None and dev.align < DEFAULT_ALIGN:
        return CheckResult.warn(
            f"{dev.name} align {format_size(dev.align)}: below 2 MiB the pool cannot use huge mappings",
            fix,
        )
    return CheckResult.ok(f"{dev.name} align {format_size(dev.align)}")


@REGISTRY.check(
    "dax.size-matches-manifest", "the pool's dax device is the size the layout is built on", guards_data=True
)
def size_matches(ctx: DoctorContext) -> CheckResult:
    if ctx.expect is None or ctx.expect.pool_size is None:
        return CheckResult.skip("no manifest: no pool size to compare with")
    dev = _pool_or_skip(ctx)
    if isinstance(dev, CheckResult):
        return dev
    if dev.size is None:
        return CheckResult.skip(f"{dev.name}: size not reported")
    want = ctx.expect.pool_size
    bits = ctx.snapshot.cpu.phys_address_bits
    if bits and want > 1 << bits:
        return CheckResult.fail(
            f"the manifest's pool is {format_size(want)}: more than this CPU's {bits}-bit physical address space "
            f"({format_size(1 << bits)}) can hold, so no host can map it",
            f"set pool.size: {dev.size} in the manifest (the dax device's size)",
        )
    if dev.size < want:
        return CheckResult.fail(
            f"{dev.name} is {format_size(dev.size)}, the manifest's pool is {format_size(want)}: "
            "the layout's last partitions would lie past the end of the device",
            f"set pool.size: {dev.size} in the manifest (every host must agree), or rebuild the region/namespace",
        )
    if dev.size > want:
        return CheckResult.warn(
            f"{dev.name} is {format_size(dev.size)}, the manifest's pool is {format_size(want)}: "
            f"{format_size(dev.size - want)} at the end stays unused",
            f"set pool.size: {dev.size} in the manifest to use all of it",
        )
    return CheckResult.ok(f"{dev.name} is {format_size(dev.size)}, as the manifest says")


def _pinned_namespace(ctx: DoctorContext, field: str) -> tuple[NdNamespace, str] | CheckResult:
    """The pool's namespace and the manifest's pinned `namespace_<field>`, or the verdict that ends the check."""
    exp = ctx.expect
    want = getattr(exp, f"namespace_{field}") if exp is not None else None
    if exp is None or want is None:
        return CheckResult.skip(f"no namespace {field} pinned in a manifest")
    if exp.source == "dax":
        return CheckResult.skip("the pool is an existing dax device: no namespace to compare")
    dev = _pool_or_skip(ctx)
    if isinstance(dev, CheckResult):
        return dev
    ns = _namespace_of(ctx, dev)
    if ns is None:
        return CheckResult.fail(f"{dev.name} is not on a libnvdimm namespace; the manifest pins one", setup_fix(ctx))
    return ns, want


def _identity_fix(ctx: DoctorContext, ns: NdNamespace) -> str:
    return (
        _reconfig_cmd(ctx, ns) + " (rewrites the namespace info block at the start of the shared region: "
        "only while no host serves from the pool)"
    )


def _identity(ctx: DoctorContext, field: str) -> CheckResult:
    pinned = _pinned_namespace(ctx, field)
    if isinstance(pinned, CheckResult):
        return pinned
    ns, want = pinned
    have = getattr(ns, field)
    if (have or "").lower() != want.lower():
        return CheckResult.fail(
            f"{ns.dev} {field} is {have!r}, the manifest pins {want!r}: this host did not create the rack's namespace",
            _identity_fix(ctx, ns),
        )
    return CheckResult.ok(f"{ns.dev} {field} {have}")


# Modes whose namespace starts with an info block: ndctl's "uuid" is then the block's, not the label's.
_INFO_BLOCK_MODES = ("devdax", "fsdax", "sector")


@REGISTRY.check("dax.namespace-uuid", "the namespace label uuid is the manifest's pinned one")
def namespace_uuid(ctx: DoctorContext) -> CheckResult:
    pinned = _pinned_namespace(ctx, "uuid")
    if isinstance(pinned, CheckResult):
        return pinned
    ns, want = pinned
    fix = _identity_fix(ctx, ns)
    if ns.label_uuid is not None:
        if ns.label_uuid.lower() != want.lower():
            return CheckResult.fail(
                f"{ns.dev} label uuid is {ns.label_uuid!r}, the manifest pins {want!r}: "
                "this host did not create the rack's namespace",
                fix,
            )
        return CheckResult.ok(f"{ns.dev} label uuid {ns.label_uuid}")
    # No label uuid known (sysfs unreadable, ndctl without raw_uuid): ndctl's "uuid" is all there is.
    if (ns.uuid or "").lower() == want.lower():
        return CheckResult.ok(f"{ns.dev} uuid {ns.uuid} (label uuid unknown; ndctl's uuid matches)")
    if ns.mode in _INFO_BLOCK_MODES:
        return CheckResult.warn(
            f"{ns.dev} label uuid unknown (sysfs {ns.dev}/uuid not readable); ndctl's uuid {ns.uuid!r} is the "
            f"{ns.mode} info block's, so it cannot be compared with the pinned {want!r}",
            f"check by hand: cat /sys/bus/nd/devices/{ns.dev}/uuid (or `ndctl list -v -n {ns.dev}`, raw_uuid)",
        )
    return CheckResult.fail(
        f"{ns.dev} uuid is {ns.uuid!r} (label uuid unknown, compared ndctl's uuid), the manifest pins {want!r}: "
        "this host did not create the rack's namespace",
        fix,
    )


@REGISTRY.check("dax.namespace-name", "the namespace name is the manifest's pinned one")
def namespace_name(ctx: DoctorContext) -> CheckResult:
    return _identity(ctx, "name")


@REGISTRY.check(
    "dax.permissions", "the pool's /dev node is not open to every local user (and is as pool.permissions says)"
)
def permissions(ctx: DoctorContext) -> CheckResult:
    dev = _pool_or_skip(ctx)
    if isinstance(dev, CheckResult):
        return dev
    if not dev.dev_exists or dev.dev_mode is None:
        return CheckResult.skip(f"{dev.dev_path or dev.name}: no /dev node to inspect (see dax.device-present)")
    path = dev.dev_path or device_path(dev.name)
    owner = dev.dev_owner or str(dev.dev_uid)
    group = dev.dev_group or str(dev.dev_gid)
    mode = stat.S_IMODE(dev.dev_mode)
    summary = f"{path} {owner}:{group} {mode:04o}"
    exp = ctx.expect
    if exp is not None and exp.dev_mode is not None:
        want = f"{exp.dev_owner}:{exp.dev_group} {exp.dev_mode:04o}"
        fix = f"{setup_fix(ctx)} (writes a udev rule and sets {want}; by hand: chown {exp.dev_owner}:{exp.dev_group} "
        fix += f"{path} && chmod {exp.dev_mode:04o} {path})"
    else:
        rule = UDEV_RULE.format(name=dev.name)
        fix = f"chgrp beluga {path} && chmod 0660 {path}; persist it with a udev rule, {rule}"
    if mode & stat.S_IWOTH:
        return CheckResult.fail(
            f"{summary}: world-writable, so any local user can overwrite every host's KV blocks and the RPC rings",
            fix,
        )
    if exp is not None and exp.dev_mode is not None:
        differs = []
        if not _same_account(exp.dev_owner, dev.dev_owner, dev.dev_uid):
            differs.append(f"owner {owner}, not {exp.dev_owner}")
        if not _same_account(exp.dev_group, dev.dev_group, dev.dev_gid):
            differs.append(f"group {group}, not {exp.dev_group}")
        if mode != exp.dev_mode:
            differs.append(f"mode {mode:04o}, not {exp.dev_mode:04o}")
        if differs:
            return CheckResult.fail(
                f"{summary}: {'; '.join(differs)} (the manifest's pool.permissions): the serving processes may "
                "be refused the pool, or others let in",
                fix,
            )
    if mode & stat.S_IROTH:
        return CheckResult.warn(f"{summary}: world-readable, so any local user can read every tenant's KV cache", fix)
    if exp is not None and exp.dev_mode is not None:
        return CheckResult.ok(f"{summary}, as pool.permissions says")
    return CheckResult.ok(summary)


def _same_account(want: str | None, name: str | None, number: int | None) -> bool:
    """A manifest owner/group (name or numeric id) against the node's (name when it resolves, and id)."""
    if want is None:
        return True
    return want == name or (want.isdigit() and number is not None and int(want) == number)
