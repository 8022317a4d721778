"""What `plan`, `setup` and `teardown` show and do: Steps made of exact Actions, gathered in a Plan.

These types are pure data. A planner in `belugactl.workflows.setup` builds them from what a host
has and what the manifest wants; the applier there executes the actions through a Host. Keeping
them as data is what lets `plan` and `setup --dry-run` print exactly what `setup` would do, and
lets `--json` carry the same thing to a machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol


# --- actions: one exact mutation each ----------------------------------------------------------
@dataclass(frozen=True)
class RunCommand:
    """Run one program (argv list, never a shell string)."""

    kind: ClassVar[str] = "run"
    argv: tuple[str, ...]
    timeout: float = 120.0

    def display(self) -> str:
        return " ".join(_quote(a) for a in self.argv)


@dataclass(frozen=True)
class WriteAttr:
    """Write a short value to a kernel attribute (sysfs or procfs); the kernel decides what it means."""

    kind: ClassVar[str] = "write-attr"
    path: str
    value: str

    def display(self) -> str:
        return f"echo {_quote(self.value)} > {self.path}"


@dataclass(frozen=True)
class WriteFile:
    """Create or replace a configuration file (a udev rule, a systemd unit)."""

    kind: ClassVar[str] = "write-file"
    path: str
    text: str
    mode: int = 0o644

    def display(self) -> str:
        lines = self.text.count("\n") or 1
        return f"write {self.path} ({lines} line{'s' if lines != 1 else ''}, mode {self.mode:04o})"


@dataclass(frozen=True)
class RemoveFile:
    kind: ClassVar[str] = "remove-file"

    path: str

    def display(self) -> str:
        return f"rm {self.path}"


@dataclass(frozen=True)
class SetOwnership:
    """chown/chmod of a device node, so the change holds now and not only after the next boot."""

    kind: ClassVar[str] = "set-ownership"
    path: str
    owner: str
    group: str
    mode: int

    def display(self) -> str:
        return f"chown {self.owner}:{self.group} {self.path} && chmod {self.mode:04o} {self.path}"


@dataclass(frozen=True)
class PciConfigRmw:
    """Read-modify-write of one byte of a PCI function's config space.

    `expect` is the byte read when planning: the applier re-reads it and refuses to write when the
    byte changed underneath (never write a whole byte we have not just read).
    """

    kind: ClassVar[str] = "pci-config-rmw"
    bdf: str
    offset: int
    clear_bits: int
    set_bits: int
    expect: int

    @property
    def new_value(self) -> int:
        return (self.expect & ~self.clear_bits & 0xFF) | self.set_bits

    def display(self) -> str:
        mask = self.clear_bits | self.set_bits
        # The setpci(8) spelling of the same write: only the bits in the mask change.
        return (
            f"setpci -s {self.bdf} {self.offset:x}.b={self.set_bits:02x}:{mask:02x}"
            f"   # 0x{self.expect:02x} -> 0x{self.new_value:02x}"
        )


@dataclass(frozen=True)
class MtrrAdd:
    kind: ClassVar[str] = "mtrr-add"

    base: int
    size: int
    type: str = "uncachable"  # the kernel's spelling

    def display(self) -> str:
        return f'echo "base=0x{self.base:x} size=0x{self.size:x} type={self.type}" > /proc/mtrr'


@dataclass(frozen=True)
class MtrrRemove:
    kind: ClassVar[str] = "mtrr-remove"

    reg: int
    base: int
    size: int

    def display(self) -> str:
        return f'echo "disable={self.reg}" > /proc/mtrr   # base=0x{self.base:x} size=0x{self.size:x}'


@dataclass(frozen=True)
class WritePoolHeader:
    """Claim the pool (claim word compare-and-swap, then re-read) and write its header at offset 0."""

    kind: ClassVar[str] = "write-pool-header"
    device: str
    rewrite: bool = False  # replacing a header that disagrees: the pool's contents are discarded

    def display(self) -> str:
        verb = "rewrite" if self.rewrite else "claim, write and re-read"
        return f"{verb} the pool header at offset 0 of {self.device}"


@dataclass(frozen=True)
class WritePoolMembership:
    """Rewrite the pool header's host table in place (a capacity layout's membership): no region
    moves, the claim and epoch lines are not touched."""

    kind: ClassVar[str] = "write-pool-membership"
    device: str
    version: int  # the membership version the plan saw; another is refused

    def display(self) -> str:
        return f"record the rack's membership (version {self.version} -> {self.version + 1}) in the pool header of " \
            f"{self.device}"


class Action(Protocol):
    """What every action is: a frozen dataclass with a JSON `kind` and its exact command for display.

    The classes above are the built-in ones; a topic may define its own next to its executor
    (workflows/setup/topic.py) without touching this module.
    """

    kind: ClassVar[str]

    def display(self) -> str: ...


def action_to_dict(action: Action) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": action.kind, "display": action.display()}
    for f in fields(action):  # type: ignore[arg-type]
        value = getattr(action, f.name)
        data[f.name] = list(value) if isinstance(value, tuple) else value
    return data


# --- steps and plans ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One change to a host: what, the exact actions, and what it costs.

    `id` is stable (`hugepages.node1`, `mtrr.add`), so scripts and state can name a step; `topic`
    names the setup topic that planned it, and the applier hands the step back to that topic's
    hooks (never by reading the id). `subject` is what the step changes in the topic's own terms
    (a NUMA node and page size, a root port), for those hooks; it is not shown.
    A `deferred` step depends on an earlier one (a dax device that does not exist yet): its actions
    are fixed when the earlier step has run, and the applier plans again before applying it.

    Whether a step may run is decided in one place (workflows/setup/force.py) from three fields:
    `destroys_data` (it needs --force); `refusal`, the error raised in its place while planning
    when --force is not given (a header that differs: the field diff, not a step to look at); and
    `forced`, the step that replaces it under --force (waiting for another host's claim becomes
    taking it over).
    """

    id: str
    topic: str
    summary: str
    actions: tuple[Action, ...] = ()
    destroys_data: bool = False
    before: str | None = None
    after: str | None = None
    note: str | None = None
    deferred: bool = False
    subject: Any = field(default=None, compare=False)
    refusal: Exception | None = field(default=None, compare=False, repr=False)
    forced: Step | None = field(default=None, compare=False, repr=False)

    @property
    def needs_force(self) -> bool:
        return self.destroys_data

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topic": self.topic,
            "summary": self.summary,
            "destroys_data": self.destroys_data,
            "deferred": self.deferred,
            "before": self.before,
            "after": self.after,
            "note": self.note,
            "actions": [action_to_dict(a) for a in self.actions],
        }


@dataclass(frozen=True)
class Skip:
    """A topic the planner chose not to touch, and why (DDIO on an AMD CPU, a setting left unmanaged)."""

    topic: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"topic": self.topic, "reason": self.reason}


@dataclass
class Plan:
    host: str
    verb: str = "setup"  # or "teardown"
    steps: list[Step] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        return not self.steps

    @property
    def destructive(self) -> list[Step]:
        return [s for s in self.steps if s.destroys_data]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "verb": self.verb,
            "converged": self.converged,
            "destroys_data": bool(self.destructive),
            "steps": [s.to_dict() for s in self.steps],
            "skipped": [s.to_dict() for s in self.skipped],
            "notes": list(self.notes),
        }


def _quote(arg: str) -> str:
    """Quote for display only (nothing here is ever given to a shell)."""
    if arg and all(c.isalnum() or c in "-_./:=,@+%" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"
