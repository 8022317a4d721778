"""`bench serve --concurrent N`: N long prompts at once, throughput pool hit vs recompute.

Pass 1: instance A answers the N prompts at once (computes them, its connector saves them).
Pass 2 on B, all at once, twice: with the pool (every prompt a hit) and with the connector off
under a fresh `cache_salt` (B's prefix cache cannot answer: a recompute). Throughput is N over the
wall time from the first send to the last answer (requests/s); the ratio is pool over recompute
(target >= 3x; Beluga paper 7.35x on GPUs). vLLM's own token counts per pass say where the KV came
from, so a pass that was not what it claims is visible in the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from belugactl.workflows.bench import serving_stats
from belugactl.workflows.serve.traffic import complete_all, prompt_token_sources, token_prompt

PAPER_RATIO = 7.35
TARGET_RATIO = 3.0


def _sources(port: int) -> dict[str, float]:
    try:
        return prompt_token_sources(port)
    except OSError:
        return {}


def _diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}


def run_concurrent(
    port_a: int,
    port_b: int,
    *,
    count: int = 16,
    length: int = 4000,
    nonce: str = "0",
    settle_s: float = 1.0,
    stats_a: str | None = None,
    stats_b: str | None = None,
    save_wait_s: float = 30.0,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    prompts = [token_prompt(length, seed=7_000_000 + length * 100 + i) for i in range(count)]
    pool_salt, recompute_salt = f"conc-pool-{nonce}", f"conc-recompute-{nonce}"
    saved_before = serving_stats.saves_done(serving_stats.read_counters(stats_a))
    save, save_s = complete_all(port_a, prompts, cache_salt=pool_salt)
    say(f"bench serve: concurrent: A computed and saved {count} x {length} tokens in {save_s:.2f} s")
    if stats_a:
        # Asynchronous saves end after the answers: every one must be in the pool before B is timed.
        deadline = time.monotonic() + save_wait_s
        while serving_stats.saves_done(serving_stats.read_counters(stats_a)) < saved_before + count:
            if time.monotonic() > deadline:
                say(f"bench serve: concurrent: A's saves did not all finish within {save_wait_s:.0f} s")
                break
            time.sleep(0.05)
    passes: dict[str, dict[str, Any]] = {}
    answers = {}
    for kind, use_pool, salt in (("recompute", False, recompute_salt), ("pool_hit", True, pool_salt)):
        time.sleep(settle_s)
        before, counters = _sources(port_b), serving_stats.read_counters(stats_b)
        answers[kind], wall = complete_all(port_b, prompts, use_pool=use_pool, cache_salt=salt)
        time.sleep(settle_s)  # the connector's stats files lag by up to 0.25 s
        change = serving_stats.delta(counters, serving_stats.read_counters(stats_b))
        passes[kind] = {
            "wall_s": wall,
            "requests_per_s": count / wall if wall else None,
            "token_sources": _diff(before, _sources(port_b)),
            "metadata_us_per_request": serving_stats.metadata_of(change)["us"] / count if change else None,
        }
        say(f"bench serve: concurrent: B {kind.replace('_', ' ')}: {count} in {wall:.2f} s")
    pool_rps, recompute_rps = passes["pool_hit"]["requests_per_s"], passes["recompute"]["requests_per_s"]
    ratio = pool_rps / recompute_rps if pool_rps and recompute_rps else None
    return {
        "prompts": count,
        "prompt_tokens": length,
        "save_pass_s": save_s,
        "recompute": passes["recompute"],
        "pool_hit": passes["pool_hit"],
        "throughput_ratio": ratio,
        "same_tokens": all(
            a.tokens == b.tokens == c.tokens
            for a, b, c in zip(save, answers["recompute"], answers["pool_hit"], strict=True)
        ),
        "paper_ratio": PAPER_RATIO,
        "target_ratio": TARGET_RATIO,
        "met": None if ratio is None else ratio >= TARGET_RATIO,
    }
