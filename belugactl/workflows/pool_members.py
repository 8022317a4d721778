"""`belugactl pool members`: record a manifest's membership in a capacity pool's header in place.

Setup's header topic does this for a device pool (`header.members`); this is the same step for a
pool file (CI, the CPU demo, benchmarks), which no setup manages. It refuses everything that is
not a membership change: another geometry is a new layout (`pool create-file` on a new file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from belugactl.errors import PoolMismatch, UsageError
from belugactl.pool import header as hdr
from belugactl.pool import membership as members
from belugactl.pool.mapping import PoolMapping, reinit_fix


@dataclass(frozen=True)
class MembersOutcome:
    path: str
    change: members.MembershipChange | None  # None: the pool already has this membership
    written: hdr.PoolHeader | None  # None: a dry run, or nothing to write

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "change": self.change.to_dict() if self.change else None,
            "lines": self.change.lines() if self.change else [],
            "written": self.written is not None,
            "members_version": self.written.members_version if self.written else None,
        }


def record_file_members(path: Path, rack: Any, *, dry_run: bool, force: bool) -> MembersOutcome:
    from belugactl.host.host import Host

    manifest, layout = rack.manifest, rack.layout
    if layout.capacity is None:
        raise UsageError(
            "this manifest has no layout.capacity: its hosts are part of the layout, not a membership",
            fix="add layout.capacity to lay a pool out for hosts and processes that come and go (a new layout: "
            "create a new pool file)",
        )
    # created_by is not rewritten (the record keeps who created the pool); no host lookup needed
    ours = hdr.PoolHeader.from_layout(manifest, layout, created_by="belugactl")
    if not path.is_file() or path.is_symlink():
        what = "a symbolic link" if path.is_symlink() else "not a regular file" if path.exists() else "missing"
        raise UsageError(
            f"pool members works on a pool file; {path} is {what}",
            fix="name the pool file (`belugactl pool create-file` made it); a device pool's membership is recorded "
            "by `belugactl setup -f MANIFEST` on one host",
        )
    with PoolMapping.window(Host.local(), str(path), hdr.HEADER_REGION, writable=not dry_run) as window:
        if not dry_run:
            members.recover(window)  # a rewrite a crash interrupted is finished first
        found = members.read_header(window.read)
        change = members.compare(ours, found, layout)
        if change is None and (problems := hdr.diff(ours, found)):
            raise PoolMismatch(
                f"pool {path} is not laid out for this manifest's geometry, so this is not a membership change",
                why="\n".join(f"{f}: manifest {a!r}, pool {b!r}" for f, a, b in problems[:12])
                + "\nwhat changed: " + "; ".join(hdr.describe_change(ours, found)),
                fix=reinit_fix(path),
            )
        if change is None or dry_run:
            return MembersOutcome(str(path), change, None)
        if change.moves_partitions and not force:
            raise UsageError(
                f"{change.moved_text} would change partition slot, leaving its partition's contents in the old "
                "slot; nothing was changed",
                fix="pin each such host to its slot (`slot: N` under the host), or rerun with --force",
            )
        return MembersOutcome(str(path), change, members.record(window, ours, found, layout))
