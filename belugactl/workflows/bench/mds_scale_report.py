"""`bench mds --scale`'s one table: every figure beside issue 31's target for it, and whether it is met.

Pure functions over the benchmark's JSON document, so the table is tested without a server. A row
is (what, where, measured, target, met); `met` is None where the issue sets no target at that point
(restart times are judged from 4 M blocks, where the issue states them) or nothing was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Issue 31's targets, in the units the benchmark measures.
PAUSE_MS = 5.0
BYTES_PER_BLOCK = 128
SAVE_BLOCKS_PER_S = 500_000
RESTART_S_PER_M_BLOCKS = 2.5  # 4 M in 10 s, 16 M in 40 s: linear
RESTART_JUDGED_FROM = 4_000_000
STOP_S = 1.0
QD1_P50_US = 1.2  # today's QD1 p50 (the "keep it at or below")
QD1_RATIO = 1.5  # at any ring count, against the fewest rings measured (16 in the issue)
PASS_FLUSH_US = 5.0
QD128_MOPS = 6.0
SKIPPED = "skipped (budget)"

Row = tuple[str, str, str, str, bool | None]


def parse_count(text: str) -> int:
    """`100k`, `1M`, `4m`, `2000`: a block or ring count (k and M are powers of ten)."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if t.endswith("k"):
        scale, t = 1_000, t[:-1]
    elif t.endswith("m"):
        scale, t = 1_000_000, t[:-1]
    value = float(t)  # ValueError for anything else
    n = int(value * scale)
    if n <= 0 or n != value * scale:
        raise ValueError(text)
    return n


def parse_counts(text: str, *, lowest: int, highest: int) -> list[int]:
    """A comma list of counts, each within [lowest, highest], sorted, without repeats."""
    items = [x for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError("empty")
    counts = sorted({parse_count(x) for x in items})
    if counts[0] < lowest or counts[-1] > highest:
        raise ValueError(f"out of [{lowest}, {highest}]")
    return counts


def count_label(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1e6:g}M"
    if n >= 1_000 and n % 100 == 0:
        return f"{n / 1e3:g}k"
    return str(n)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def size_rows(size: dict[str, Any]) -> list[Row]:
    """The rows of one index size."""
    n = size["blocks"]
    at = f"{count_label(n)} blocks"
    if size.get("status") == SKIPPED:
        return [("every figure at this size", at, SKIPPED, "-", None)]
    rows: list[Row] = []
    if size.get("status", "done") != "done":
        rows.append(("fill", at, f"{size['status']}: {size['filled']:,} blocks", "-", None))
    bpb = size.get("bytes_per_block")
    rows.append((
        "server memory a block", at,
        "-" if bpb is None else f"{bpb:,.0f} B ({size['anon_rss_bytes'] / 2**20:,.0f} MiB anonymous RSS)",
        f"<={BYTES_PER_BLOCK} B/block", None if bpb is None else bpb <= BYTES_PER_BLOCK,
    ))  # fmt: skip
    rate = size.get("save_blocks_per_s")
    cpu = size.get("server_cpu_us_per_block")
    rows.append((
        "batched save (reserve + commit)", at,
        "-" if rate is None else f"{rate:,.0f} blocks/s ({cpu:.1f} us server CPU a block)",
        f">={SAVE_BLOCKS_PER_S // 1000}k blocks/s a thread", None if rate is None else rate >= SAVE_BLOCKS_PER_S,
    ))  # fmt: skip
    look = size.get("lookup_us")
    rows.append((
        "lookup p50 / p99 (QD1)", at, "-" if not look else f"{look['p50']:.1f} / {look['p99']:.1f} us", "-", None,
    ))  # fmt: skip
    pause = size.get("pause") or {}
    longest = pause.get("client_longest_s")
    rows.append((
        "loop's longest pause (client probe)", at,
        "-" if longest is None
        else f"{_ms(longest)} ({pause['client_gaps_over_target']} gaps >{PAUSE_MS:g} ms in {pause['answers']:,})",
        f"<{PAUSE_MS:g} ms", None if longest is None else longest * 1e3 < PAUSE_MS,
    ))  # fmt: skip
    server = pause.get("server_longest_s")
    rows.append((
        "loop's longest turn (server stats)", at, "not reported" if server is None else _ms(server),
        f"<{PAUSE_MS:g} ms", None if server is None else server * 1e3 < PAUSE_MS,
    ))  # fmt: skip
    rows.extend(_restart_rows(size, at, n))
    rows.append(_eviction_row(size, at))
    rows.append(_mixed_row(size, at))
    return rows


def _restart_rows(size: dict[str, Any], at: str, n: int) -> list[Row]:
    r = size.get("restart")
    if r is None or r.get("status") == SKIPPED:
        why = SKIPPED if r else "-"
        return [("restart to /readyz (journal)", at, why, "-", None), ("SIGTERM to exit", at, why, "-", None)]
    if r.get("status", "done") != "done":
        return [("restart to /readyz (journal)", at, r["status"], "-", False)]
    limit = RESTART_S_PER_M_BLOCKS * n / 1e6
    judged = n >= RESTART_JUDGED_FROM
    return [
        (
            "restart to /readyz (journal)", at, f"{r['ready_s']:.2f} s, {r['restored']:,} blocks restored",
            f"<={limit:.1f} s (10 s at 4M, linear)" if judged else "<=10 s at 4M (judged from 4M)",
            (r["ready_s"] <= limit and r["restored"] >= r["expected"]) if judged else None,
        ),
        ("SIGTERM to exit", at, f"{r['stop_s']:.2f} s", f"<={STOP_S:g} s", r["stop_s"] <= STOP_S),
    ]  # fmt: skip


def _eviction_row(size: dict[str, Any], at: str) -> Row:
    e = size.get("eviction")
    what = "watermark eviction: the save that crossed it"
    if e is None:
        return (what, at, "-", f"<{PAUSE_MS:g} ms", None)
    if not e["events"]:
        return (what, at, f"not reached ({e['used_fraction']:.0%} of the KV area used)", f"<{PAUSE_MS:g} ms", None)
    measured = f"p99 {_ms(e['save_s_p99'])} ({e['events']} saves, {e['evicted']:,} blocks evicted)"
    return (what, at, measured, f"<{PAUSE_MS:g} ms", e["save_s_p99"] * 1e3 < PAUSE_MS)


def _mixed_row(size: dict[str, Any], at: str) -> Row:
    m = size.get("mixed")
    what = "one large reserve in a pool of small blocks"
    if m is None:
        return (what, at, "-", "-", None)
    if m.get("status") == SKIPPED:
        return (what, at, SKIPPED, "-", None)
    allowed = (m["large_bytes"] + m["chunk_bytes"]) // m["small_bytes"]
    measured = (
        f"{m['evicted']:,} evicted in {_ms(m['reserve_s'])} ({m['live_before']:,} small blocks live, "
        f"{m['large_bytes'] >> 20} MiB reserve)"
    )
    return (what, at, measured, f"<={allowed:,} evicted (own size + a chunk)", m["evicted"] <= allowed)


def ring_rows(rings: Sequence[dict[str, Any]]) -> list[Row]:
    """QD1 p50, a pass's cost and throughput at each ring count, each coherence mode."""
    if not rings:
        return []
    done = [r for r in rings if r.get("status", "done") == "done"]
    base = done[0] if done else None
    rows: list[Row] = []
    for r in rings:
        at = f"{r['rings']:,} rings"
        if r.get("status", "done") != "done":
            rows.append(("every figure at this ring count", at, r["status"], "-", None))
            continue
        for mode in ("none", "flush"):
            m = r[mode]
            base_p50 = base[mode]["qd1_p50_us"] if base else None
            ratio = m["qd1_p50_us"] / base_p50 if base_p50 else None
            rows.append((
                f"QD1 lookup p50 ({mode})", at,
                f"{m['qd1_p50_us']:.2f} us (p99 {m['qd1_p99_us']:.1f}; {ratio:.2f}x of {base['rings']:,} rings)"
                if ratio is not None and base is not None else f"{m['qd1_p50_us']:.2f} us",
                f"<={QD1_RATIO:g}x of the fewest rings, <={QD1_P50_US:g} us",
                None if ratio is None else ratio <= QD1_RATIO and m["qd1_p50_us"] <= QD1_P50_US,
            ))  # fmt: skip
            pass_us = m.get("pass_us")
            target = f"<{PASS_FLUSH_US:g} us at 1,152 rings" if mode == "flush" else "-"
            judged = mode == "flush" and r["rings"] >= 1152 and pass_us is not None
            rows.append((
                f"one ring pass ({mode})", at, "not reported" if pass_us is None else f"{pass_us:.2f} us", target,
                (pass_us < PASS_FLUSH_US) if judged else None,
            ))  # fmt: skip
            ops = m.get("qd128_ops_per_s")
            judged = r["rings"] >= 1152 and ops is not None
            rows.append((
                f"QD128 lookups, native client ({mode})", at, "-" if ops is None else f"{ops / 1e6:.2f} Mops",
                f">={QD128_MOPS:g} Mops at 1,152 rings" if mode == "none" else "-",
                (ops / 1e6 >= QD128_MOPS) if judged and mode == "none" else None,
            ))  # fmt: skip
    return rows


def report_rows(doc: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for size in doc.get("sizes", []):
        rows.extend(size_rows(size))
    rows.extend(ring_rows(doc.get("rings", [])))
    return rows


def met_summary(rows: Sequence[Row]) -> dict[str, int]:
    return {
        "met": sum(1 for r in rows if r[4] is True),
        "not_met": sum(1 for r in rows if r[4] is False),
        "not_judged": sum(1 for r in rows if r[4] is None),
    }
