"""The pool header: the first host writes it, every other host verifies it against its manifest.

The race between two first hosts is guarded by the header's claim word (pool/header.py): a host
sets it from 0 to a random nonce with compare-and-swap, waits a settle time, reads it again, and
only if it still holds its own nonce writes the record (magic last). A host that loses waits for
the winner's header and verifies it. A header that disagrees with this host's manifest is never
overwritten without --force, because rewriting it discards everything the pool holds; nor is a
header area that holds anything but zeros (someone's data, not a pool that was never used).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from belugactl.errors import BelugaError, InputError, StepFailed
from belugactl.host.host import Host
from belugactl.model.setup_plan import Skip, Step, WritePoolHeader, WritePoolMembership
from belugactl.pool import header as hdr
from belugactl.pool import membership as members
from belugactl.pool.device import device_path
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.force import ForceRequired
from belugactl.workflows.setup.pool_lookup import pool_dax_usable
from belugactl.workflows.setup.target import HeaderSpec, SetupTarget
from belugactl.workflows.setup.topic import ApplyContext, Planned, SetupTopic

ID = "header"


class HeaderMismatch(BelugaError):
    """The pool's header disagrees with this host's manifest; nothing was changed."""

    def __init__(self, device: str, rows: list[tuple[str, Any, Any]], change: list[str] | None = None) -> None:
        self.rows = rows
        self.change = change or []
        table = "\n".join(f"{name}: manifest {_show(ours)}, pool {_show(theirs)}" for name, ours, theirs in rows)
        rings = next(((a, b) for n, a, b in rows if n == "rpc_ring_count" and int(a) > int(b)), None)
        why_rings = (
            f": it has {rings[1]} CXL-RPC rings where this manifest needs {rings[0]} (one per vLLM process); it was "
            "set up by an older belugactl (one ring per instance) or for fewer processes"
            if rings
            else ""
        )
        # The ring count's own explanation above already says what changed; the list would repeat it.
        changed = f"; what changed: {'; '.join(self.change)}" if self.change and not rings else ""
        super().__init__(
            f"the pool header on {device} disagrees with this host's manifest ({len(rows)} field(s)){why_rings}"
            f"{changed}",
            why=f"{table}\n{DROPPED}",
            fix="use the manifest the pool was created with; or, to re-create the pool and DISCARD its contents "
            "on every host, rerun with --force",
        )

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["change"] = list(self.change)
        data["diff"] = [{"field": n, "manifest": _show(a), "pool": _show(b)} for n, a, b in self.rows]
        return data


# What a header rewrite costs, said wherever one is refused. Without layout.capacity the layout hash
# covers the host list, each host's partition and each ring's owner; with it only the geometry.
DROPPED = (
    "without layout.capacity the layout hash covers the host list, each host's partition and each ring's owner, "
    "so a change of them is a new layout; with --force the header is rewritten and every cached KV block is "
    "dropped (vLLM recomputes them). A pool laid out with layout.capacity keeps its cache across such changes "
    "(docs/serving.md, \"Day two\"); moving to one is itself a new layout"
)


def _show(value: Any) -> str:
    return str(value)


@dataclass(frozen=True)
class HeaderVerdict:
    state: str  # "blank" | "occupied" | "claimed" | "match" | "members" | "interrupted" | "differs" | "corrupt"
    rows: tuple[tuple[str, Any, Any], ...] = ()
    reason: str | None = None
    claim: int = 0
    change: tuple[str, ...] = ()  # "differs": what the operator changed, in their words
    members: members.MembershipChange | None = None  # "members": the same geometry, other hosts in its slots


def judge(spec: HeaderSpec, found: bytes) -> HeaderVerdict:
    if found[hdr.MAGIC_OFFSET : hdr.MAGIC_OFFSET + len(hdr.MAGIC)] == bytes(len(hdr.MAGIC)):
        claim = hdr.read_claim(found)
        if claim:
            return HeaderVerdict("claimed", reason=f"claim word {claim:#018x} set, no header yet", claim=claim)
        return _blank_or_occupied(found)
    try:
        theirs = hdr.PoolHeader.unpack(found)
    except InputError as exc:
        staged = members.staged(lambda offset, n: found[offset : offset + n])
        if staged is not None and staged.pool_uuid == spec.ours.pool_uuid:
            return HeaderVerdict("interrupted", reason=exc.what, members=members.MembershipChange(
                staged.members_version))  # fmt: skip
        return HeaderVerdict("corrupt", reason=exc.what)
    rows = hdr.diff(spec.ours, theirs)
    if not rows:
        return HeaderVerdict("match")
    if spec.layout is not None and (change := members.compare(spec.ours, theirs, spec.layout)) is not None:
        return HeaderVerdict("members", rows=tuple(rows), members=change, change=tuple(change.lines()))
    return HeaderVerdict("differs", rows=tuple(rows), change=tuple(hdr.describe_change(spec.ours, theirs)))


def _blank_or_occupied(found: bytes) -> HeaderVerdict:
    """Blank means every byte of the header area is zero, not only the magic and the claim word."""
    reason = hdr.occupied_reason(found)
    return HeaderVerdict("blank") if reason is None else HeaderVerdict("occupied", reason=reason)


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    spec: HeaderSpec | None = target.header
    if spec is None:
        return Planned(skipped=[Skip(ID, "no layout given: the header is neither written nor verified")])
    name = pool_dax_usable(target, facts)
    if name is None:
        return Planned(steps=[
            Step(
                id="header.write-or-verify",
                topic=ID,
                summary="write the pool header (first host) or verify it against this manifest",
                deferred=True,
                note="the pool device exists once the earlier steps have run",
            )
        ])
    device = device_path(name)
    if facts.header_bytes is None:
        # Not fatal for planning (a captured tree has no device to map); setup ends failing on it.
        return Planned(steps=[
            Step(
                id="header.write-or-verify",
                topic=ID,
                summary=f"write or verify the pool header on {device}",
                deferred=True,
                note=f"cannot read the pool header from {device}: {facts.header_error or 'not mappable'} "
                "(run as root; check `daxctl list` for the device and its align)",
            )
        ])
    verdict = judge(spec, facts.header_bytes)
    if verdict.state == "match":
        return Planned()
    return Planned(steps=[_step_for(verdict, spec, device)])


def _step_for(verdict: HeaderVerdict, spec: HeaderSpec, device: str) -> Step:
    after = f"header for pool {spec.ours.pool_uuid}, layout {spec.ours.layout_hash[:12]}"
    if verdict.state == "claimed" and hdr.claimed_by(verdict.claim, spec.ours.created_by):
        return _take_own_claim(verdict, spec, device, after)
    if verdict.state in ("blank", "claimed"):
        return _initialize(verdict, device, after)
    if verdict.state == "occupied":
        return _initialize_over_data(verdict, device, after)
    if verdict.state == "members":
        return _record_members(verdict, device)
    if verdict.state == "interrupted":
        assert verdict.members is not None
        return Step(
            id="header.members",
            topic=ID,
            summary=f"finish the membership rewrite a crash interrupted on {device} (version "
            f"{verdict.members.version}, staged in the header region), then record this manifest's",
            actions=(WritePoolMembership(device, verdict.members.version),),
            before=verdict.reason,
            after="a readable header; every cached KV block kept",
            note="pool/membership.py recover(): the staged record is written in place, never the claim or epoch",
        )
    return _rewrite(verdict, device, after)


def _record_members(verdict: HeaderVerdict, device: str) -> Step:
    """The same geometry with other hosts in its slots: rewrite the host table in place, keeping
    every cached block. A host that changes slots leaves its partition behind: that needs --force."""
    change = verdict.members
    assert change is not None
    lines = change.lines()
    return Step(
        id="header.members",
        topic=ID,
        summary=f"record the rack's membership in the pool header on {device}: " + "; ".join(lines)
        + "; keeps every cached KV block, the journal and the other hosts' partitions",
        actions=(WritePoolMembership(device, change.version),),
        destroys_data=change.moves_partitions,
        before=f"membership version {change.version}",
        after=f"membership version {change.version + 1}: " + "; ".join(lines),
        note="no region moves (layout.capacity fixes the geometry); other hosts pick it up on their next setup "
        "or serve",
        refusal=ForceRequired(
            f"{change.moved_text} would change partition slot, leaving its partition's contents in the old slot; "
            "nothing was changed",
            why="a host without `slot:` takes its place in the host list, so removing or reordering hosts above it "
            "moves it",
            fix="pin each such host to the slot the pool has for it (`slot: N` under the host in the manifest), or "
            "rerun with --force to move it (its old partition's bytes are left in the old slot; the shared KV "
            "cache is kept either way)",
        ) if change.moves_partitions else None,
    )


def _take_own_claim(verdict: HeaderVerdict, spec: HeaderSpec, device: str, after: str) -> Step:
    # Our own tag: a setup of this host died between its claim and the magic. Setup holds this
    # host's lock, so no live writer of ours exists: take the claim over (no --force needed).
    return Step(
        id="header.write",
        topic=ID,
        summary=f"initialize the pool: write its header on {device}, taking over this host's stale claim",
        actions=(WritePoolHeader(device),),
        before=f"{verdict.reason}: set by {spec.ours.created_by} in a setup that did not finish",
        after=after,
        note="the claim word carries this host's tag; it is swapped for a new nonce, then written as usual",
    )


def _initialize(verdict: HeaderVerdict, device: str, after: str) -> Step:
    """Blank: write it. Another host's (or an untagged) claim: wait for its header; with --force the
    operator says that host is not initializing any more, so take the claim whatever it holds."""
    take_over = None
    if verdict.state == "claimed":
        take_over = Step(
            id="header.write",
            topic=ID,
            summary=f"TAKE OVER another host's claim and write the pool header on {device}",
            actions=(WritePoolHeader(device, rewrite=True),),
            destroys_data=True,
            before=f"{verdict.reason}: not this host's claim",
            after=after,
            note="only safe when no other host is running setup on this pool",
        )
    return Step(
        id="header.write",
        topic=ID,
        summary=f"initialize the pool: write its header on {device} (or verify the one a racing host writes)",
        actions=(WritePoolHeader(device),),
        before="no header" if verdict.state == "blank" else verdict.reason,
        after=after,
        note="claim word compare-and-swap first: if another host wins, this one verifies its header",
        forced=take_over,
    )


def _initialize_over_data(verdict: HeaderVerdict, device: str, after: str) -> Step:
    return Step(
        id="header.write",
        topic=ID,
        summary=f"initialize the pool OVER THE DATA on {device}: write its header there",
        actions=(WritePoolHeader(device),),
        destroys_data=True,
        before=verdict.reason,
        after=after,
        note="the device holds bytes belugactl did not write; the header and then the pool's users overwrite them",
        refusal=ForceRequired(
            f"{device} holds data but no pool header; writing the header would destroy it; nothing was changed",
            why=f"{verdict.reason}: not a pool belugactl initialized, nor a blank device",
            fix=f"check that {device} is the pool's device (pool.source in the manifest); if nothing on it is "
            "needed, rerun with --force to write the header over it (DISCARDS that data)",
        ),
    )


def _rewrite(verdict: HeaderVerdict, device: str, after: str) -> Step:
    """A header that differs from the manifest's, or an unreadable one: only --force replaces it."""
    refusal: BelugaError = (
        StepFailed(
            f"the pool header on {device} is unreadable: {verdict.reason}",
            why="the bytes at offset 0 are not a valid belugactl header",
            fix="if this pool holds nothing you need, rerun with --force to write a new header "
            "(this DISCARDS the pool's contents)",
        )
        if verdict.state == "corrupt"
        else HeaderMismatch(device, list(verdict.rows), list(verdict.change))
    )
    return Step(
        id="header.rewrite",
        topic=ID,
        summary=f"REWRITE the pool header on {device}: every host's view of the pool's contents is discarded",
        actions=(WritePoolHeader(device, rewrite=True),),
        destroys_data=True,
        before=verdict.reason or "; ".join(f"{n}: {b} (manifest {a})" for n, a, b in verdict.rows),
        after=after,
        note="other hosts must be stopped; they verify the new header on their next setup",
        refusal=refusal,
    )


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    if facts.state.get("header"):
        return Planned(notes=["the pool header stays: other hosts may still use the pool"])
    return Planned()


def observe(host: Host, target: SetupTarget, facts: SetupFacts) -> None:
    if target.header is None:
        return
    device = pool_dax_usable(target, facts)
    if device is not None:
        facts.header_bytes, facts.header_error = read_header_bytes(host, device_path(device), target.header.map_size)


def read_header_bytes(host: Host, device: str, size: int) -> tuple[bytes | None, str | None]:
    try:
        with PoolMapping.window(host, device, size, writable=False) as window:
            # another host's membership rewrite lasts microseconds: read past it
            return members.settled_bytes(window.read, size), None
    except BelugaError as exc:
        return None, exc.what
    except OSError as exc:  # e.g. ENXIO from a dax node with no driver bound
        return None, f"{device}: {exc.strerror or exc}"


# --- applying --------------------------------------------------------------------------------
def apply_members(ctx: ApplyContext, action: WritePoolMembership) -> str:
    spec = ctx.target.header
    if spec is None:
        raise StepFailed("no header to write: the layout was not resolved")
    with PoolMapping.window(ctx.host, action.device, spec.map_size, flush=_atomics() is not None) as window:
        members.recover(window)  # a rewrite a crash interrupted is finished first
        found = members.read_header(window.read)
        if not hdr.diff(spec.ours, found):
            return f"the membership is recorded (version {found.members_version})"
        if found.members_version != action.version:
            raise StepFailed(
                f"the pool's membership on {action.device} is version {found.members_version}, not the "
                f"{action.version} this plan was made from",
                why="another host recorded a membership meanwhile",
                fix="make sure every host has the same manifest, then rerun `belugactl setup --dry-run`",
            )
        new = members.record(window, spec.ours, found, spec.layout)
    ctx.state["header"] = {"device": action.device, "members_version": new.members_version}
    return f"recorded the membership (version {new.members_version}, epoch {new.members_epoch}): {len(new.hosts)} " \
        "host(s)"


def apply_write(ctx: ApplyContext, action: WritePoolHeader) -> str:
    if ctx.target.header is None:
        raise StepFailed("no header to write: the layout was not resolved")
    outcome = write_or_verify_header(ctx.host, action.device, ctx.target.header, rewrite=action.rewrite)
    ctx.state["header"] = {"device": action.device, "wrote": outcome.wrote, "claim": f"{outcome.claim:#x}"}
    if outcome.took_over:
        ctx.state["header"]["took_over"] = f"{outcome.took_over:#x}"
        return f"wrote the header (took over this host's stale claim {outcome.took_over:#018x})"
    return "wrote the header" if outcome.wrote else "another host wrote the header; verified it"


@dataclass(frozen=True)
class HeaderOutcome:
    wrote: bool  # this host wrote the header (else it verified another host's)
    claim: int
    took_over: int = 0  # the stale claim of this host's that was replaced, if any


def write_or_verify_header(
    host: Host,
    device: str,
    spec: HeaderSpec,
    *,
    rewrite: bool = False,
    settle_s: float = 0.2,
    wait_s: float = 30.0,
    nonce: int | None = None,
) -> HeaderOutcome:
    """Claim, write (magic last) and re-read; or, having lost the claim, wait for and verify the winner's."""
    # The nonce carries this host's tag (pool/header.py claim_nonce), so a claim left by a crashed
    # setup of this host can be recognised, and taken over, by its next setup.
    nonce = nonce if nonce is not None else hdr.claim_nonce(spec.ours.created_by)
    took_over = 0
    with PoolMapping.window(host, device, spec.map_size, flush=_atomics() is not None) as window:
        if rewrite:
            # --force: take the claim whatever it holds, then write as the first host would.
            window.write(hdr.CLAIM_OFFSET, nonce.to_bytes(8, "little"))
            window.write(hdr.MAGIC_OFFSET, bytes(len(hdr.MAGIC)))
        else:
            found = window.cas_u64(hdr.CLAIM_OFFSET, 0, nonce)
            # Ours, from a setup that died before the magic (this process holds the host's setup
            # lock, so that setup is gone): swap it for our nonce, exactly as a fresh claim.
            if (found != 0 and _stale_own_claim(window, spec, found)
                    and window.cas_u64(hdr.CLAIM_OFFSET, found, nonce) == found):
                found, took_over = 0, found
            if found != 0:
                return _await_winner(window, spec, device, wait_s, found)
        time.sleep(settle_s)
        if window.load_u64(hdr.CLAIM_OFFSET) != nonce:
            return _await_winner(window, spec, device, wait_s, window.load_u64(hdr.CLAIM_OFFSET))
        record = replace(spec.ours, claim=nonce, created_time=int(time.time()))
        window.write(0, record.pack(include_magic=False))
        window.write(hdr.MAGIC_OFFSET, hdr.MAGIC)
        # Re-read: another host whose claim raced ours would have changed the claim word by now.
        verdict = judge(spec, window.read(0, spec.map_size))
        if verdict.state != "match" or window.load_u64(hdr.CLAIM_OFFSET) != nonce:
            raise StepFailed(
                f"the pool header on {device} did not read back as written",
                why=verdict.reason or f"claim word is now {window.load_u64(hdr.CLAIM_OFFSET):#018x}: another host "
                "wrote at the same time",
                fix="stop setup on the other hosts, then rerun `belugactl setup --force` on one host only",
            )
        return HeaderOutcome(wrote=True, claim=nonce, took_over=took_over)


def _stale_own_claim(window: PoolMapping, spec: HeaderSpec, claim: int) -> bool:
    if not hdr.claimed_by(claim, spec.ours.created_by):
        return False
    magic = window.read(hdr.MAGIC_OFFSET, len(hdr.MAGIC))
    return magic == bytes(len(hdr.MAGIC))


def _atomics() -> Any:
    """The data plane's native helper (hardware CAS, flush, fence), when it was built."""
    try:
        from belugactl.dataplane import native
    except ImportError:
        return None
    return native if native.features().get("native") else None


def _await_winner(window: PoolMapping, spec: HeaderSpec, device: str, wait_s: float, claim: int) -> HeaderOutcome:
    deadline = time.monotonic() + wait_s
    while True:
        verdict = judge(spec, window.read(0, spec.map_size))
        if verdict.state == "match":
            return HeaderOutcome(wrote=False, claim=claim)
        if verdict.state == "members":
            raise StepFailed(
                f"another host wrote the pool header on {device} with another membership: "
                + "; ".join(verdict.change),
                fix="make sure every host has the same manifest, then rerun `belugactl setup` (a membership change "
                "keeps every cached block)",
            )
        if verdict.state == "differs":
            raise HeaderMismatch(device, list(verdict.rows), list(verdict.change))
        if verdict.state == "corrupt":
            raise StepFailed(f"the pool header on {device} is unreadable: {verdict.reason}")
        if time.monotonic() >= deadline:
            raise StepFailed(
                f"another host claimed the pool on {device} but wrote no header within {wait_s:.0f} s",
                why=verdict.reason or "claim word set, magic still zero",
                fix="if no other host is running setup, it crashed mid-way: rerun with --force to reset the claim",
            )
        time.sleep(0.05)


TOPIC = SetupTopic(
    id=ID,
    order=40,
    summary="the pool header at offset 0: written by the first host, verified by the others",
    plan=plan,
    teardown=teardown,
    survives_reboot=True,
    observe=observe,
    executors={WritePoolHeader: apply_write, WritePoolMembership: apply_members},
    changes=frozenset(),
)
