"""`bench serve`: time to first token on instance B with the pool hit vs without it (recompute).

For every prompt length and round: instance A computes a fresh prompt (its blocks go to the pool);
then B answers the same prompt twice, once with the connector off for that request (a full
prefill: the baseline) and once with it on (blocks loaded from the pool), in alternating order.
Medians side by side, the speed-up and the reduction (Beluga paper: 89.6 % lower TTFT).

With `router_port` (`--via-router`) every prompt is also sent through the rack's front door (HAProxy,
least connections: it may pick A or B; both reach the pool at the same cost), both ways, so the
router's own cost is the difference between its column and the direct one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from belugactl.workflows.serve.traffic import complete, prompt_token_sources, token_prompt


def run(
    port_a: int,
    port_b: int,
    *,
    lengths: Sequence[int] = (1024, 2048, 4000),
    rounds: int = 3,
    block_size: int = 32,
    settle_s: float = 1.0,
    router_port: int | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    rows = []
    for length in lengths:
        miss: list[float] = []
        hit: list[float] = []
        routed: dict[bool, list[float]] = {False: [], True: []}
        same = True
        loaded_tokens = 0.0
        for r in range(rounds):
            prompt = token_prompt(length, seed=length * 1000 + r)
            complete(port_a, prompt, max_tokens=1)
            before = _external(port_b)
            order = (False, True) if r % 2 == 0 else (True, False)
            answers = {}
            for use_pool in order:
                # Each timed request starts on a quiet machine: on a few cores the previous request's
                # tail (engine, server polling) would otherwise be billed to the next one.
                time.sleep(settle_s)
                answers[use_pool] = complete(port_b, prompt, max_tokens=1, use_pool=use_pool)
            loaded_tokens += _external(port_b) - before
            miss.append(answers[False].seconds)
            hit.append(answers[True].seconds)
            same = same and answers[False].tokens == answers[True].tokens
            say(f"bench serve: {length} tokens, round {r + 1}: recompute {miss[-1]:.3f} s, pool hit {hit[-1]:.3f} s")
            if router_port is not None:
                for use_pool in order:
                    time.sleep(settle_s)
                    answer = complete(router_port, prompt, max_tokens=1, use_pool=use_pool)
                    routed[use_pool].append(answer.seconds)
                    same = same and answer.tokens == answers[use_pool].tokens
                say(
                    f"bench serve: {length} tokens, round {r + 1}, via the router: recompute "
                    f"{routed[False][-1]:.3f} s, pool hit {routed[True][-1]:.3f} s"
                )
        ttft_miss = statistics.median(miss)
        ttft_hit = statistics.median(hit)
        rows.append(
            {
                "prompt_tokens": length,
                "rounds": rounds,
                "ttft_recompute_s": ttft_miss,
                "ttft_pool_hit_s": ttft_hit,
                "speedup": ttft_miss / ttft_hit if ttft_hit else None,
                "ttft_reduction_pct": 100.0 * (1 - ttft_hit / ttft_miss) if ttft_miss else None,
                "loaded_tokens_per_hit": loaded_tokens / rounds,
                "expected_loaded_tokens": (length - 1) // block_size * block_size,
                "same_tokens": same,
                "samples": {"recompute_s": miss, "pool_hit_s": hit},
            }
        )
        if router_port is not None:
            rows[-1]["via_router"] = {
                "ttft_recompute_s": statistics.median(routed[False]),
                "ttft_pool_hit_s": statistics.median(routed[True]),
                "router_cost_pool_hit_s": statistics.median(routed[True]) - ttft_hit,
                "samples": {"recompute_s": routed[False], "pool_hit_s": routed[True]},
            }
    return {
        "instances": {"a": port_a, "b": port_b},
        "router_port": router_port,
        "settle_s": settle_s,
        "rows": rows,
        "paper": {"ttft_reduction_pct": 89.6},
        "target": {"speedup": 5.0},
    }


def _external(port: int) -> float:
    try:
        return prompt_token_sources(port).get("external_kv_transfer", 0.0)
    except OSError:
        return 0.0
