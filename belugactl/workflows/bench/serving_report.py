"""The baseline table of `bench serve`, as text lines, from its document (no numbers of its own)."""

from __future__ import annotations

from typing import Any

from belugactl.workflows.bench.serving_stats import format_us_keys


def _s(value: float | None) -> str:
    return f"{value:.3f}s" if value is not None else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _example_cell(row: dict[str, Any]) -> str:
    ex = row.get("example_connector") or {}
    if ex.get("status") == "ok":
        return _s(row.get("ttft_example_hit_s"))
    if ex.get("status") == "fails":
        return f"fails: {ex.get('reason')}"
    return "not measured"


def baseline_lines(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"baselines ({doc.get('engine_setting_label') or 'as running'}; B's local prefix-cache hit is the floor: "
        "no copy at all)",
        f"{'prompt':>8} {'recompute':>10} {'pool hit':>9} {'local hit':>10} {'pool/local':>11} {'pool/example':>13}"
        "  ExampleConnector hit",
    ]
    for row in doc["rows"]:
        ratios = row.get("ratios") or {}
        lines.append(
            f"{row['prompt_tokens']:>8} {_s(row['ttft_recompute_s']):>10} {_s(row['ttft_pool_hit_s']):>9} "
            f"{_s(row.get('ttft_local_hit_s')):>10} {_x(ratios.get('pool_hit_over_local_hit')):>11} "
            f"{_x(ratios.get('pool_hit_over_example_hit')):>13}  {_example_cell(row)}"
        )
    lines.append("targets: pool hit <= 1.5x the local hit, and below the ExampleConnector hit")
    for row in doc["rows"]:
        lines += _row_notes(row)
    conc = doc.get("concurrent")
    if conc:
        rec, hit = conc["recompute"], conc["pool_hit"]
        lines.append(
            f"concurrent: {conc['prompts']} prompts x {conc['prompt_tokens']} tokens at once: pool hit "
            f"{_rate(hit['requests_per_s'])}, recompute {_rate(rec['requests_per_s'])}: "
            f"{_x(conc['throughput_ratio'])} (target >= {conc['target_ratio']:g}x; paper {conc['paper_ratio']:g}x "
            f"on GPUs); same tokens {conc['same_tokens']}"
        )
    return lines


def _rate(value: float | None) -> str:
    return f"{value:.2f} req/s" if value is not None else "-"


def _row_notes(row: dict[str, Any]) -> list[str]:
    n = row["prompt_tokens"]
    out = []
    local = row.get("local_hit") or {}
    if local.get("status") != "ok":
        out.append(f"  {n} tokens: local hit not measured: {local.get('reason')}")
    meta = row.get("metadata") or {}
    if meta.get("reported"):
        share = meta.get("share_of_pool_hit_pct")
        save = (row.get("save_metadata") or {}).get("median_us")
        out.append(
            f"  {n} tokens: connector metadata per pool hit {meta['median_us']:.0f} us "
            f"({format_us_keys(meta['by_key_median_us'])}; round trips {meta['round_trips']})"
            + (f" = {share:.2f} % of the pool-hit TTFT (target < 1 %)" if share is not None else "")
            + (f"; per save on A {save:.0f} us" if save is not None else "")
        )
    elif meta:
        out.append(f"  {n} tokens: connector metadata per pool hit: no stats file reported it")
    paired = row.get("paired") or {}
    if "pool_over_example_per_round" in paired:
        above = ""
        if "example_above_local_ms" in paired:
            above = (
                f"above the local hit pool +{paired['pool_above_local_ms']:.1f} ms, ExampleConnector "
                f"+{paired['example_above_local_ms']:.1f} ms; "
            )
        out.append(
            f"  {n} tokens: round by round (medians): {above}pool/example "
            f"{paired['pool_over_example_per_round']:.2f}x; the pool faster in {paired['rounds_pool_faster']} "
            f"of {paired['rounds']} rounds"
        )
    brk = row.get("breakdown")
    if brk:
        out.append(
            f"  {n} tokens: the pool hit's {brk['pool_hit_ms']:.1f} ms vs the local hit's {brk['local_hit_ms']:.1f} ms "
            f"({brk['beyond_floor_ms']:+.1f} ms): metadata {brk['metadata_ms']:.2f} ms, copy {brk['copy_ms']:.2f} ms "
            f"(load_us"
            + (
                f"; the forward waited {brk['copy_wait_ms']:.2f} ms of it, layer_wait_us"
                if brk.get("copy_wait_ms") is not None
                else ""
            )
            + f"), unattributed {brk['unattributed_ms']:.1f} ms "
            "(engine step with the connector, scheduling, HTTP)"
        )
        if brk.get("missing_stats"):
            out.append(f"  {n} tokens: stats a finer split needs: {', '.join(brk['missing_stats'])}")
    dishonest = [kind for kind, ok in (row.get("honest") or {}).items() if ok is False]
    if dishonest:
        sources = row.get("token_sources") or {}
        out.append(
            f"  {n} tokens: WARNING: {', '.join(dishonest)} did not get its KV from where it claims "
            f"(vLLM's prompt tokens by source: {', '.join(f'{k} {sources.get(k)}' for k in dishonest)})"
        )
    return out
