"""The pool header: the first host writes it, every other host verifies it against its manifest.

The race between two first hosts is guarded by the header's claim word (model/header.py): a host
sets it from 0 to a random nonce with compare-and-swap, waits a settle time, reads it again, and
only if it still holds its own nonce writes the record (magic last). A host that loses waits for
the winner's header and verifies it. A header that disagrees with this host's manifest is never
overwritten without --force, because rewriting it discards everything the pool holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from belugactl.errors import BelugaError, InputError, StepFailed
from belugactl.host.host import Host
from belugactl.model.plan import Skip, Step, WritePoolHeader
from belugactl.pool import header as hdr
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget


class HeaderMismatch(BelugaError):
    """The pool's header disagrees with this host's manifest; nothing was changed."""

    def __init__(self, device: str, rows: list[tuple[str, Any, Any]]) -> None:
        self.rows = rows
        table = "\n".join(f"{name}: manifest {_show(ours)}, pool {_show(theirs)}" for name, ours, theirs in rows)
        super().__init__(
            f"the pool header on {device} disagrees with this host's manifest ({len(rows)} field(s))",
            why=table,
            fix="use the manifest the pool was created with; or, to re-create the pool and DISCARD its contents "
            "on every host, rerun with --force",
        )

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["diff"] = [{"field": n, "manifest": _show(a), "pool": _show(b)} for n, a, b in self.rows]
        return data


def _show(value: Any) -> str:
    return str(value)


@dataclass(frozen=True)
class HeaderSpec:
    """The header this host's manifest implies, and how much of the pool to map to see it."""

    ours: hdr.PoolHeader
    map_size: int = hdr.HEADER_REGION


def header_spec_for(manifest: Any, layout: Any, host_name: str) -> HeaderSpec:
    return HeaderSpec(ours=hdr.PoolHeader.from_layout(manifest, layout, created_by=host_name))


@dataclass(frozen=True)
class HeaderVerdict:
    state: str  # "blank" | "claimed" | "match" | "differs" | "corrupt"
    rows: tuple[tuple[str, Any, Any], ...] = ()
    reason: str | None = None
    claim: int = 0


def judge(spec: HeaderSpec, found: bytes) -> HeaderVerdict:
    if hdr.is_blank(found):
        return HeaderVerdict("blank")
    if found[hdr.MAGIC_OFFSET : hdr.MAGIC_OFFSET + len(hdr.MAGIC)] == bytes(len(hdr.MAGIC)):
        claim = hdr.read_claim(found)
        return HeaderVerdict("claimed", reason=f"claim word {claim:#018x} set, no header yet", claim=claim)
    try:
        theirs = hdr.PoolHeader.unpack(found)
    except InputError as exc:
        return HeaderVerdict("corrupt", reason=exc.what)
    rows = hdr.diff(spec.ours, theirs)
    return HeaderVerdict("differs", rows=tuple(rows)) if rows else HeaderVerdict("match")


def plan_header(target: SetupTarget, facts: SetupFacts, force: bool) -> tuple[list[Step], list[Skip]]:
    from belugactl.workflows.setup.steps_pool import pool_dax_device

    spec: HeaderSpec | None = target.header
    if spec is None:
        return [], [Skip("header", "no layout given: the header is neither written nor verified")]
    name = pool_dax_device(target, facts)
    if name is None:
        return [
            Step(
                id="header.write-or-verify",
                topic="header",
                summary="write the pool header (first host) or verify it against this manifest",
                deferred=True,
                note="the pool device exists once the earlier steps have run",
            )
        ], []
    device = f"/dev/{name}"
    if facts.header_bytes is None:
        # Not fatal for planning (a captured tree has no device to map); setup ends failing on it.
        return [
            Step(
                id="header.write-or-verify",
                topic="header",
                summary=f"write or verify the pool header on {device}",
                deferred=True,
                note=f"cannot read the pool header from {device}: {facts.header_error or 'not mappable'} "
                "(run as root; check `daxctl list` for the device and its align)",
            )
        ], []
    verdict = judge(spec, facts.header_bytes)
    if verdict.state == "match":
        return [], []
    if verdict.state == "claimed" and hdr.claimed_by(verdict.claim, spec.ours.created_by):
        # Our own tag: a setup of this host died between its claim and the magic. Setup holds this
        # host's lock, so no live writer of ours exists: take the claim over (no --force needed).
        return [
            Step(
                id="header.write",
                topic="header",
                summary=f"initialize the pool: write its header on {device}, taking over this host's stale claim",
                actions=(WritePoolHeader(device),),
                before=f"{verdict.reason}: set by {spec.ours.created_by} in a setup that did not finish",
                after=f"header for pool {spec.ours.pool_uuid}, layout {spec.ours.layout_hash[:12]}",
                note="the claim word carries this host's tag; it is swapped for a new nonce, then written as usual",
            )
        ], []
    if verdict.state == "claimed" and force:
        # Another host's (or an untagged) claim with no header behind it, and the operator says that
        # host is not initializing any more: take the claim whatever it holds.
        return [
            Step(
                id="header.write",
                topic="header",
                summary=f"TAKE OVER another host's claim and write the pool header on {device}",
                actions=(WritePoolHeader(device, rewrite=True),),
                destroys_data=True,
                before=f"{verdict.reason}: not this host's claim",
                after=f"header for pool {spec.ours.pool_uuid}, layout {spec.ours.layout_hash[:12]}",
                note="only safe when no other host is running setup on this pool",
            )
        ], []
    if verdict.state in ("blank", "claimed"):
        return [
            Step(
                id="header.write",
                topic="header",
                summary=f"initialize the pool: write its header on {device} (or verify the one a racing host writes)",
                actions=(WritePoolHeader(device),),
                before="no header" if verdict.state == "blank" else verdict.reason,
                after=f"header for pool {spec.ours.pool_uuid}, layout {spec.ours.layout_hash[:12]}",
                note="claim word compare-and-swap first: if another host wins, this one verifies its header",
            )
        ], []
    if not force:
        if verdict.state == "corrupt":
            raise StepFailed(
                f"the pool header on {device} is unreadable: {verdict.reason}",
                why="the bytes at offset 0 are not a valid belugactl header",
                fix="if this pool holds nothing you need, rerun with --force to write a new header "
                "(this DISCARDS the pool's contents)",
            )
        raise HeaderMismatch(device, list(verdict.rows))
    return [
        Step(
            id="header.rewrite",
            topic="header",
            summary=f"REWRITE the pool header on {device}: every host's view of the pool's contents is discarded",
            actions=(WritePoolHeader(device, rewrite=True),),
            destroys_data=True,
            before=verdict.reason or "; ".join(f"{n}: {b} (manifest {a})" for n, a, b in verdict.rows),
            after=f"header for pool {spec.ours.pool_uuid}, layout {spec.ours.layout_hash[:12]}",
            note="other hosts must be stopped; they verify the new header on their next setup",
        )
    ], []


# --- applying --------------------------------------------------------------------------------
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
    # The nonce carries this host's tag (model/header.py claim_nonce), so a claim left by a crashed
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
        record = _with_claim(spec.ours, nonce)
        body = record.pack(include_magic=False)
        window.write(0, body)
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


def _with_claim(header: hdr.PoolHeader, nonce: int) -> hdr.PoolHeader:
    from dataclasses import replace

    return replace(header, claim=nonce, created_time=int(time.time()))


def _await_winner(window: PoolMapping, spec: HeaderSpec, device: str, wait_s: float, claim: int) -> HeaderOutcome:
    deadline = time.monotonic() + wait_s
    while True:
        verdict = judge(spec, window.read(0, spec.map_size))
        if verdict.state == "match":
            return HeaderOutcome(wrote=False, claim=claim)
        if verdict.state == "differs":
            raise HeaderMismatch(device, list(verdict.rows))
        if verdict.state == "corrupt":
            raise StepFailed(f"the pool header on {device} is unreadable: {verdict.reason}")
        if time.monotonic() >= deadline:
            raise StepFailed(
                f"another host claimed the pool on {device} but wrote no header within {wait_s:.0f} s",
                why=verdict.reason or "claim word set, magic still zero",
                fix="if no other host is running setup, it crashed mid-way: rerun with --force to reset the claim",
            )
        time.sleep(0.05)
