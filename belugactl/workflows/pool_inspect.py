"""`pool inspect`: what is on the pool right now, read from the media (and the metadata server, if it runs).

`pool show` is the manifest's view (where things should be); this is the pool's: the header as
written, the live epoch and claim words, each RPC ring's owner and last request (from the slot
headers' sequence words), the journal's state, and the shared KV area's usage from the metadata
server's admin `/stats`. The pool is mapped read-only; nothing here writes to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.dataplane.rpc.protocol import HEADER, MAGIC, REQ_READY, RESP_READY
from belugactl.model.manifest_schema import MAX_HOSTS
from belugactl.pool import header as hdr
from belugactl.pool.mapping import PoolMapping

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Manifest

SLOT_STATES = {0: "free", REQ_READY: "request waiting", RESP_READY: "reply waiting"}
DEFAULT_ADMIN_URL = "http://127.0.0.1:9470"
# The most rings a manifest can lay out: MAX_HOSTS hosts x 64 instances x (a scheduler + 64
# workers), plus 4096 spare rings (model/manifest_schema.py's limits).
MAX_LAYOUT_RINGS = MAX_HOSTS * 64 * 65 + 4096
# Bounds on what one inspect reads and lists; a rack of 16 hosts with 256-slot rings reads about 70 k.
SCAN_SLOTS_MAX = 1 << 17
LIST_RINGS_MAX = 4096


def admin_url_for(manifest: Manifest | None) -> str:
    """Where the metadata server's admin HTTP answers, as serve would start it on the server's host."""
    if manifest is None or manifest.serve is None:
        return DEFAULT_ADMIN_URL
    meta = manifest.serve.metadata
    bind = meta.admin_bind if meta.admin_bind not in ("0.0.0.0", "::") else "127.0.0.1"
    host = f"[{bind}]" if ":" in bind else bind
    return f"http://{host}:{meta.admin_port}"


def inspect_pool(
    path: str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    admin_url: str | None = None,
    stats: Any = None,
) -> dict[str, Any]:
    """The pool's state as one JSON-able document. `stats`: a /stats document already fetched (tests)."""
    _refuse_special_file(Path(path))
    with PoolMapping.open(path, writable=False) as pool:
        header = pool.header
        epoch = pool.epoch()
        claim = pool.load_u64(hdr.CLAIM_OFFSET)
        against = _against_manifest(header, manifest)
        # ring owners come from the manifest's clients, which only hold for the layout it wrote
        rings, rings_summary = _rings(pool, manifest if against is not None and against["matches"] else None, epoch)
        doc: dict[str, Any] = {
            "path": str(pool.path),
            "devdax": pool.is_devdax,
            "size": pool.size,
            "header": header.to_dict(),
            "layout_hash": header.layout_hash,
            "epoch": epoch,
            "claim": {"word": claim, "holder": _claim_holder(claim, header)},
            "hosts": [
                {"index": i, "name": h.name, "offset": h.offset, "size": h.size, "end": h.offset + h.size}
                for i, h in enumerate(header.hosts)
            ],
            "manifest": against,
            "rings": rings,
            "rings_summary": rings_summary,
            "journal": _journal(pool),
        }
    url = admin_url or admin_url_for(manifest)
    doc["shared_kv"] = _shared_kv(header.geometry, Path(path), epoch, url, stats)
    return doc


def _refuse_special_file(path: Path) -> None:
    """A pool is a device or a regular file; opening a FIFO (or a socket) would block or fail obscurely."""
    import stat

    from belugactl.errors import UsageError

    try:
        mode = path.stat().st_mode
    except OSError:
        return  # PoolMapping.open says what is missing
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISDIR(mode):
        return
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"
    raise UsageError(
        f"{path} is {kind}, not a pool",
        why="a pool is a devdax device (/dev/daxX.Y) or a pool file; opening this would wait for a writer",
        fix="pass the pool's device or file (belugactl pool create-file makes a file pool)",
    )


def _claim_holder(claim: int, header: hdr.PoolHeader) -> str | None:
    if claim == 0:
        return None
    for h in header.hosts:
        if hdr.claimed_by(claim, h.name):
            return h.name
    return "unknown (no host in the table carries this tag)"


def _against_manifest(header: hdr.PoolHeader, manifest: Manifest | None) -> dict[str, Any] | None:
    if manifest is None:
        return None
    from belugactl.model.layout import resolve_layout

    layout = resolve_layout(manifest)
    expected = hdr.PoolHeader.from_layout(manifest, layout, created_by=header.created_by)
    differences = hdr.diff(expected, header)
    return {
        "rack": manifest.name,
        "layout_hash": layout.layout_hash,
        "matches": not differences,
        "differences": [{"field": f, "manifest": a, "pool": b} for f, a, b in differences],
    }


def _ring_owners(manifest: Manifest | None) -> dict[int, str]:
    if manifest is None:
        return {}
    from belugactl.model.layout import resolve_layout

    layout = resolve_layout(manifest)
    owners = {c.ring: c.owner for c in layout.clients}  # host/vllm-N/process
    if layout.capacity is not None:  # rings of a slot its host does not use, or of a free slot
        for ring in range(layout.capacity[0] * layout.capacity[1]):
            owners.setdefault(ring, f"slot {ring // layout.capacity[1]}, unused")
    return owners


def _slot_header(pool: PoolMapping, offset: int) -> tuple[int, ...]:
    """One slot's header words; straight from the mapping unless this host must drop stale lines first."""
    if pool.needs_flush:
        return HEADER.unpack(pool.read(offset, HEADER.size))
    return HEADER.unpack_from(pool.buf, offset)


def _rings(pool: PoolMapping, manifest: Manifest | None, epoch: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per ring: its owner and its latest request, from the slot headers' epoch and sequence words;
    and a summary of what was read.

    A client numbers its requests and uses slot seq % slots_per_ring, so within one server epoch
    the slot with the highest seq is the last thing that ring did. Each client incarnation starts
    at a random seq, so epochs are compared first: a newer server epoch is newer activity.

    The ring count comes from the header, which anyone who can write the pool controls: at most
    SCAN_SLOTS_MAX slot headers are read and LIST_RINGS_MAX rings listed (past that, used rings only),
    and a count past what any manifest can lay out is said, not scanned."""
    g = pool.geometry
    owners = _ring_owners(manifest)
    summary: dict[str, Any] = {"count": g.ring_count, "scanned": 0, "used": 0, "complete": True, "problem": None}
    if g.ring_count > MAX_LAYOUT_RINGS:
        summary.update(complete=False, problem=(
            f"the header says {g.ring_count} RPC rings; a manifest lays out at most {MAX_LAYOUT_RINGS}: "
            "the header was not written by belugactl setup (or is corrupted), so its rings are not read"
        ))  # fmt: skip
        return [], summary
    list_all = g.ring_count <= LIST_RINGS_MAX
    rings = []
    budget = SCAN_SLOTS_MAX
    for ring in range(g.ring_count):
        if budget < g.slots_per_ring:
            summary.update(complete=False, problem=(
                f"{g.ring_count} rings of {g.slots_per_ring} slots: only the first {ring} rings were read "
                f"(pool inspect reads at most {SCAN_SLOTS_MAX} slot headers)"
            ))  # fmt: skip
            break
        budget -= g.slots_per_ring
        last: tuple[int, int, int, int] | None = None  # epoch, seq, slot, status
        waiting = 0
        for slot in range(g.slots_per_ring):
            status, seq, magic, slot_epoch, _op, _code, _len = _slot_header(pool, g.slot_offset(ring, slot))
            if magic != MAGIC:
                continue  # never used (all zero), or not a request
            waiting += status == REQ_READY
            if last is None or (slot_epoch, seq) > last[:2]:
                last = (slot_epoch, seq, slot, status)
        summary["scanned"] += 1
        summary["used"] += last is not None
        if not list_all and (last is None or len(rings) >= LIST_RINGS_MAX):
            continue
        entry: dict[str, Any] = {
            "ring": ring,
            "offset": g.ring_offset(ring),
            "owner": owners.get(ring, "spare" if owners else None),
            "used": last is not None,
            "requests_waiting": waiting,
        }
        if last is not None:
            entry.update(
                last_epoch=last[0],
                last_seq=last[1],
                last_slot=last[2],
                last_state=SLOT_STATES.get(last[3], f"status {last[3]}"),
                # the slot carries the epoch's low 32 bits; another value is from before the last restart
                current_epoch=last[0] == epoch & 0xFFFFFFFF,
            )
        rings.append(entry)
    summary["listed"] = len(rings)
    return rings, summary


def _journal(pool: PoolMapping) -> dict[str, Any]:
    from belugactl.dataplane.mds.journal import COMMIT, REMOVE, Journal
    from belugactl.dataplane.mds.journal import MAGIC as JOURNAL_MAGIC

    g = pool.geometry
    out: dict[str, Any] = {"offset": g.journal_offset, "size": g.journal_size}
    try:
        journal = Journal(pool, g.journal_offset, g.journal_size)
    except ValueError as exc:
        return {**out, "state": "none", "note": str(exc)}
    if pool.read(g.journal_offset, len(JOURNAL_MAGIC)) != JOURNAL_MAGIC:
        return {**out, "state": "empty", "note": "no journal written (restart policy start-empty, or never served)"}
    commits = removes = 0
    for record in journal.read():
        removes += record.kind == REMOVE
        commits += record.kind == COMMIT
    return {
        **out,
        "state": "active",
        "generation": journal.generation,
        "active_half": journal.half,
        "half_size": journal.half_size,
        "bytes_used": journal.pos,
        "commits": commits,
        "removes": removes,
    }


def _shared_kv(geometry: Any, path: Path, epoch: int, url: str, stats: Any) -> dict[str, Any]:
    from belugactl.workflows.serve.control import pool_summary
    from belugactl.workflows.serve.supervisor import http_json

    out: dict[str, Any] = {
        "offset": geometry.shared_kv_offset,
        "size": geometry.shared_kv_size,
        "admin_url": url,
    }
    if stats is None:
        stats = http_json(f"{url}/stats", timeout=1.0)
    if not isinstance(stats, dict):
        return {**out, "server": "not running"}
    served = str((stats.get("pool") or {}).get("path") or "")
    if served and _same_file(served, path) is False:
        return {**out, "server": f"running, but serving another pool ({served})"}
    summary = pool_summary(stats) or {}
    note = "running" if summary.get("epoch") == epoch else f"running at epoch {summary.get('epoch')}"
    return {**out, "server": note, "usage": summary}


def _same_file(a: str, b: Path) -> bool | None:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return None  # the server's path is not visible from here (another host, another mount)
