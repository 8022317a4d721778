"""Carrying out one action: the executors for the built-in action types, chosen by the action's type.

A topic's own action types (the header write, MTRR registers) have their executors on the topic;
a WriteAttr's read-back is judged by the step's topic (`check_write`), because only it knows what
the kernel's answer means (hugepages reserved, a bracketed THP mode).
"""

from __future__ import annotations

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.write_pci import rmw_config_byte
from belugactl.host.write_sysfs import write_attr
from belugactl.host.write_udev import remove_file, set_ownership, write_config_file
from belugactl.model.setup_plan import (
    Action,
    PciConfigRmw,
    RemoveFile,
    RunCommand,
    SetOwnership,
    WriteAttr,
    WriteFile,
)
from belugactl.workflows.setup.topic import ApplyContext, Executor

ERRNO_HINTS = {
    "EBUSY": "the device is in use (mounted, mapped, or onlined as system RAM)",
    "ENOSPC": "not enough free capacity",
    "ENXIO": "the device or address range is unreachable (region commit failed?)",
    "EOPNOTSUPP": "this kernel or tool version does not support the operation",
}


def run_command(ctx: ApplyContext, action: RunCommand) -> None:
    result = ctx.host.run(action.argv, timeout=action.timeout)
    if result.not_found:
        raise EnvironmentProblem(
            f"{action.argv[0]} is not installed",
            fix="install ndctl (it provides cxl, ndctl and daxctl)",
        )
    if not result.ok:
        hint = ERRNO_HINTS.get(result.errno_name or "")
        raise StepFailed(
            f"`{action.display()}` failed",
            why=result.describe() + (f"\n{hint}" if hint else ""),
            fix="see the tool's message above; `belugactl doctor` checks the usual causes",
        )


def write_kernel_attr(ctx: ApplyContext, action: WriteAttr) -> str | None:
    back = write_attr(ctx.host, action.path, action.value)
    return ctx.topic.check_write(action, back) if ctx.topic.check_write is not None else None


def write_file(ctx: ApplyContext, action: WriteFile) -> None:
    write_config_file(ctx.host, action.path, action.text, action.mode)


def delete_file(ctx: ApplyContext, action: RemoveFile) -> None:
    remove_file(ctx.host, action.path)


def chown_device(ctx: ApplyContext, action: SetOwnership) -> None:
    set_ownership(ctx.host, action.path, action.owner, action.group, action.mode)


def pci_rmw(ctx: ApplyContext, action: PciConfigRmw) -> str:
    before, after = rmw_config_byte(
        ctx.host, action.bdf, action.offset, clear_bits=action.clear_bits, set_bits=action.set_bits,
        expect=action.expect,
    )
    return f"{action.bdf} 0x{action.offset:x}: 0x{before:02x} -> 0x{after:02x}"


BUILTIN: dict[type, Executor] = {
    RunCommand: run_command,
    WriteAttr: write_kernel_attr,
    WriteFile: write_file,
    RemoveFile: delete_file,
    SetOwnership: chown_device,
    PciConfigRmw: pci_rmw,
}


def execute(ctx: ApplyContext, action: Action) -> str | None:
    executor = ctx.topic.executor_for(action) or BUILTIN.get(type(action))
    if executor is None:
        raise TypeError(f"no executor for {type(action).__name__} in topic {ctx.topic.id}")
    return executor(ctx, action)
