"""The metadata server's journal: it covers the pool, and it has not stopped.

A journal stops only when it must (full, a write failed: dataplane/mds/journal.py); the server then
clears the journal's magic and writes a stop record into the journal area's header, and its
/readyz answers 503. This check reads that record from the pool, so it says what happened even when
no server runs (the next start restores nothing and clears it).
"""

from __future__ import annotations

import datetime

from belugactl.errors import BelugaError, EnvironmentProblem
from belugactl.pool.device import device_path
from belugactl.units import format_size
from belugactl.workflows.doctor.checks.common import manifest_arg, skip_without_cxl, skip_without_manifest
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult


def _coverage(ctx: DoctorContext) -> tuple[str, str | None]:
    """What the manifest's journal covers (a sentence), and a fix when it does not cover the pool."""
    from belugactl.model.journal_sizing import DEFAULT_MIN_BLOCK, blocks_covered, journal_bytes, namespace_bytes

    assert ctx.expect is not None and ctx.expect.manifest is not None and ctx.expect.layout is not None
    m, layout = ctx.expect.manifest, ctx.expect.layout
    min_block = m.layout.metadata.min_block or DEFAULT_MIN_BLOCK
    ns = namespace_bytes(m.name, m.serve.vllm.gpus_per_instance if m.serve is not None else 1)
    kv = layout.shared_kv.size
    journal = layout.journal.size
    text = (
        f"the journal ({format_size(journal)}) holds {blocks_covered(journal, ns):,} blocks, the shared KV area "
        f"{kv // min_block:,} of min_block {format_size(min_block)}"
    )
    need = journal_bytes(kv, min_block, ns)
    if journal >= need:
        return text, None
    return text, f"give layout.metadata.journal at least {format_size(need)} (`belugactl manifest check` names it)"


@REGISTRY.check("metadata.journal", "the metadata journal covers the pool and has not stopped")
def metadata_journal(ctx: DoctorContext) -> CheckResult:
    if (skip := skip_without_cxl(ctx) or skip_without_manifest(ctx)) is not None:
        return skip
    if ctx.expect is None or ctx.expect.layout is None or ctx.expect.manifest is None:
        return CheckResult.skip("no layout to find the journal area in")
    coverage, coverage_fix = _coverage(ctx)
    dev = ctx.pool_dax()
    unread = ""
    record = None
    if dev is None or dev.mode == "system-ram" or ctx.host is None:
        unread = "no pool device to read here"
    else:
        from belugactl.dataplane.mds.journal import read_stop
        from belugactl.pool.mapping import PoolMapping

        path = dev.dev_path or device_path(dev.name)
        journal_offset = ctx.expect.layout.journal.offset
        align = dev.align or 2 << 20
        length = -(-(journal_offset + 4096) // align) * align
        try:
            with PoolMapping.window(ctx.host, path, length, writable=False) as window:
                record = read_stop(window.read, journal_offset)
        except EnvironmentProblem as exc:
            unread = f"cannot open {path}: {exc.why or exc.what}"
        except BelugaError as exc:
            unread = f"cannot map {path}: {exc.what}"
        except (OSError, ValueError) as exc:
            unread = f"cannot read {path}: {exc}"
    if record is not None:
        when = datetime.datetime.fromtimestamp(record.at_ns / 1e9, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return CheckResult.fail(
            f"the metadata server of epoch {record.epoch} stopped journaling at {when}: {record.reason}; "
            f"the index it holds will not survive a restart, and the next start restores nothing ({coverage})",
            (coverage_fix + "; " if coverage_fix else "")
            + "if no KV block is smaller than min_block, the journal was outgrown by smaller blocks: raise "
            "layout.metadata.journal for the smallest block served (a new layout: re-initialize the idle pool "
            f"with `belugactl setup -f {manifest_arg(ctx)} --force`, which discards the cache); meanwhile a restart "
            "of the metadata server starts empty and journals again (it clears this record)",
            stop=record.to_dict(),
        )
    if coverage_fix is not None:
        return CheckResult.fail(f"{coverage}: a full pool would stop journaling", coverage_fix)
    if unread:
        return CheckResult.ok(f"{coverage}; no stop record looked for ({unread})")
    return CheckResult.ok(f"{coverage}; no stop record in the journal area")
