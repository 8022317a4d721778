"""`bench serve`: time to first token on instance B with the pool hit vs without it (recompute),
beside vLLM's own local prefix-cache hit and vLLM's ExampleConnector hit.

For every prompt length and round: instance A computes a fresh prompt (its blocks go to the pool);
then B answers the same prompt twice, once with the connector off for that request (a full
prefill: the baseline) and once with it on (blocks loaded from the pool), in alternating order.
Medians side by side, the speed-up and the reduction (Beluga paper: 89.6 % lower TTFT).

Baselines, same prompts, same engine:
- local hit (`local_hit`, B's prefix cache on): the recompute's prompt sent to B again with the
  connector off, so B's own prefix cache answers: no copy at all, the floor.
- ExampleConnector hit (`example`): an extra instance with B's argv and vLLM's file-based
  connector (workflows/bench/serving_baselines.py); "fails: <reason>" where it fails.

`cache_salt` keeps every timed request honest with B's prefix cache on: vLLM folds the salt into
the first block's hash, so the blocks a request leaves in B's cache answer only requests with the
same salt. The recompute runs under its own salt (nothing cached under it yet); the pool hit
under the salt A computed with (B has never seen it; the Beluga keys are those hashes, so A's
blocks are found). A per-run nonce in every salt keeps a reused serve's caches out. vLLM's own
count of prompt tokens by source (local compute, local cache hit, external transfer) is read
around every timed request, and `honest` says whether each kind got its KV from where it claims.

The connector's stats files (serving_stats.py) give, per pool-hit request, the metadata
microseconds and their share of the pool-hit TTFT, and, beside the local hit, where the pool hit's
extra time goes.

With `router_port` (`--via-router`) every prompt is also sent through the rack's front door (HAProxy,
least connections: it may pick A or B; both reach the pool at the same cost), both ways, so the
router's own cost is the difference between its column and the direct one. The routed pool hit
uses a salt A computed just before (B's cache must not hold it).
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from belugactl.workflows.bench import serving_stats
from belugactl.workflows.bench.serving_baselines import ExampleInstance, example_round
from belugactl.workflows.serve.traffic import Completion, complete, prompt_token_sources, token_prompt

LOCAL_RATIO_TARGET = 1.5  # pool hit within 1.5x of the local prefix-cache hit (issue 12)
# The connector writes its stats files once their counters were still for 0.05 s, looking every
# 0.2 s (vllm_beluga/stats.py): a reading this long after the last change holds it.
STATS_LAG_S = 0.5
SAVE_WAIT_S = 15.0


class _QuietReadings:
    """Readings at quiet points: B's token sources and both instances' connector counters."""

    def __init__(self, port_b: int, stats_a: str | None, stats_b: str | None) -> None:
        self.port_b, self.stats_a, self.stats_b = port_b, stats_a, stats_b

    def read(self) -> dict[str, Any]:
        return {
            "sources": _sources(self.port_b),
            "a": serving_stats.read_counters(self.stats_a),
            "b": serving_stats.read_counters(self.stats_b),
        }

    @property
    def lag_s(self) -> float:
        return STATS_LAG_S if self.stats_a or self.stats_b else 0.0


def _wait_for_save(stats_a: str | None, before: serving_stats.Counters, say: Callable[[str], None]) -> None:
    """A connector that saves asynchronously answers before its blocks are in the pool: B's pool hit
    must not be timed before A's save finished (bounded; a save that never ends leaves the pool hit
    a miss, and `honest` says so)."""
    if not stats_a:
        return
    deadline = time.monotonic() + SAVE_WAIT_S
    while serving_stats.saves_done(serving_stats.read_counters(stats_a)) <= serving_stats.saves_done(before):
        if time.monotonic() > deadline:
            say(f"bench serve: A's save did not finish within {SAVE_WAIT_S:.0f} s (its stats files say)")
            return
        time.sleep(0.05)


def _sources(port: int) -> dict[str, float] | None:
    try:
        return prompt_token_sources(port)
    except OSError:
        return None


def _source_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float] | None:
    b, a = before["sources"], after["sources"]
    if b is None or a is None:
        return None
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b))}


def _sum_sources(changes: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    if not changes or any(c is None for c in changes):
        return None
    out: dict[str, float] = {}
    for change in changes:
        for k, v in (change or {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def _honest(kind: str, sources: dict[str, float] | None) -> bool | None:
    """Did this kind of request get its KV from where it claims (vLLM's own counts)?"""
    if sources is None:
        return None
    local = sources.get("local_cache_hit", 0.0)
    external = sources.get("external_kv_transfer", 0.0)
    if kind == "recompute":
        return local == 0 and external == 0
    if kind == "pool_hit":
        return external > 0 and local == 0
    return local > 0 and external == 0  # local_hit


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


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
    local_hit: bool = False,
    stats_a: str | None = None,
    stats_b: str | None = None,
    example: ExampleInstance | None = None,
    concurrent: int = 0,
    concurrent_length: int | None = None,
    engine_setting: str | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    nonce = nonce or secrets.token_hex(4)
    readings_at = _QuietReadings(port_b, stats_a, stats_b)
    rows = []
    for length in lengths:
        samples: dict[str, list[float]] = {"recompute": [], "pool_hit": [], "local_hit": []}
        sources: dict[str, list[dict[str, float] | None]] = {"recompute": [], "pool_hit": [], "local_hit": []}
        hit_changes: list[serving_stats.Counters] = []
        save_changes: list[serving_stats.Counters] = []
        example_runs: list[dict[str, Any]] = []
        routed: dict[bool, list[float]] = {False: [], True: []}
        same = True
        for r in range(rounds):
            prompt = token_prompt(length, seed=length * 1000 + r)
            tag = f"{nonce}-{length}-{r}"
            salts = {"pool_hit": f"pool-{tag}", "recompute": f"recompute-{tag}", "local_hit": f"recompute-{tag}"}
            # (kind, port, use_pool, salt); A's compute first: its save is what B's pool hit loads.
            steps: list[tuple[str, int, bool]] = [("save", port_a, True)]
            order = [("recompute", port_b, False), ("pool_hit", port_b, True)]
            steps += order if r % 2 == 0 else order[::-1]
            if local_hit:
                steps.append(("local_hit", port_b, False))  # after the recompute that filled B's cache
            answers: dict[str, Completion] = {}
            readings = []
            for kind, port, use_pool in steps:
                # Each timed request starts on a quiet machine: on a few cores the previous request's
                # tail (engine, server polling) would otherwise be billed to the next one.
                time.sleep(max(settle_s, readings_at.lag_s))
                readings.append(readings_at.read())
                salt = salts["pool_hit"] if kind == "save" else salts[kind]
                answers[kind] = complete(port, prompt, max_tokens=1, use_pool=use_pool, cache_salt=salt)
                if kind == "save":
                    _wait_for_save(stats_a, readings[-1]["a"], say)
            time.sleep(max(settle_s, readings_at.lag_s))
            readings.append(readings_at.read())
            for i, (kind, _, _) in enumerate(steps):
                before, after = readings[i], readings[i + 1]
                if kind == "save":
                    save_changes.append(serving_stats.delta(before["a"], after["a"]))
                    continue
                samples[kind].append(answers[kind].seconds)
                sources[kind].append(_source_change(before, after))
                if kind == "pool_hit":
                    hit_changes.append(serving_stats.delta(before["b"], after["b"]))
            same = same and answers["recompute"].tokens == answers["pool_hit"].tokens
            if local_hit:
                same = same and answers["local_hit"].tokens == answers["recompute"].tokens
            line = (
                f"bench serve: {length} tokens, round {r + 1}: recompute {samples['recompute'][-1]:.3f} s, "
                f"pool hit {samples['pool_hit'][-1]:.3f} s"
            )
            if local_hit:
                line += f", local hit {samples['local_hit'][-1]:.3f} s"
            if example is not None:
                run_ = example_round(
                    example, prompt, salt_save=f"example-save-{tag}", salt_hit=f"example-hit-{tag}", settle_s=settle_s
                )
                example_runs.append(run_)
                if run_["status"] == "ok":
                    run_["same_tokens"] = run_["tokens"] == answers["recompute"].tokens
                    line += f", ExampleConnector hit {run_['hit_s']:.3f} s"
                else:
                    line += f", ExampleConnector fails: {run_['reason']}"
            say(line)
            if router_port is not None:
                # The routed pool hit needs blocks in the pool that neither instance's prefix cache holds.
                complete(port_a, prompt, max_tokens=1, cache_salt=f"router-pool-{tag}")
                for use_pool in (False, True):
                    time.sleep(settle_s)
                    salt = f"router-pool-{tag}" if use_pool else f"router-recompute-{tag}"
                    answer = complete(router_port, prompt, max_tokens=1, use_pool=use_pool, cache_salt=salt)
                    routed[use_pool].append(answer.seconds)
                    same = same and answer.tokens == answers["recompute"].tokens
                say(
                    f"bench serve: {length} tokens, round {r + 1}, via the router: recompute "
                    f"{routed[False][-1]:.3f} s, pool hit {routed[True][-1]:.3f} s"
                )
        rows.append(
            _row(
                length, rounds, block_size, samples, sources, hit_changes, save_changes, example_runs, same, local_hit
            )
        )
        if router_port is not None:
            rows[-1]["via_router"] = {
                "ttft_recompute_s": statistics.median(routed[False]),
                "ttft_pool_hit_s": statistics.median(routed[True]),
                "router_cost_pool_hit_s": statistics.median(routed[True]) - rows[-1]["ttft_pool_hit_s"],
                "samples": {"recompute_s": routed[False], "pool_hit_s": routed[True]},
            }
    concurrent_doc = None
    if concurrent > 0:
        from belugactl.workflows.bench.serving_concurrent import run_concurrent

        concurrent_doc = run_concurrent(
            port_a,
            port_b,
            count=concurrent,
            length=concurrent_length or max(lengths),
            nonce=nonce,
            settle_s=max(settle_s, readings_at.lag_s),
            stats_a=stats_a,
            stats_b=stats_b,
            say=say,
        )
    return {
        "instances": {"a": port_a, "b": port_b},
        "router_port": router_port,
        "settle_s": settle_s,
        "rows": rows,
        "paper": {"ttft_reduction_pct": 89.6, "concurrent_throughput_ratio": 7.35},
        "target": {"speedup": 5.0, "pool_hit_over_local_hit": LOCAL_RATIO_TARGET, "concurrent_throughput_ratio": 3.0},
        "engine_setting": engine_setting,
        "local_hit": local_hit,
        "example_connector": None if example is None else {"port": example.port, "log_file": example.log_file},
        "concurrent": concurrent_doc,
        "nonce": nonce,
    }


def _row(
    length: int,
    rounds: int,
    block_size: int,
    samples: dict[str, list[float]],
    sources: dict[str, list[dict[str, float] | None]],
    hit_changes: list[serving_stats.Counters],
    save_changes: list[serving_stats.Counters],
    example_runs: list[dict[str, Any]],
    same: bool,
    local_hit: bool,
) -> dict[str, Any]:
    ttft_miss = statistics.median(samples["recompute"])
    ttft_hit = statistics.median(samples["pool_hit"])
    totals = {kind: _sum_sources(changes) for kind, changes in sources.items() if changes}
    honest = {kind: _honest(kind, total) for kind, total in totals.items()}
    loaded = [
        (h or {}).get("external_kv_transfer", 0.0) + (m or {}).get("external_kv_transfer", 0.0)
        for h, m in zip(sources["pool_hit"], sources["recompute"], strict=True)
    ]
    local: dict[str, Any]
    ttft_local = None
    if not local_hit:
        local = {"status": "not measured", "reason": "B runs with its prefix cache off (--no-enable-prefix-caching)"}
    elif honest.get("local_hit") is False:
        # The request ran, but vLLM says its KV was not from B's own cache: no floor to compare with.
        local = {"status": "not measured", "reason": "B's prefix cache did not answer (vLLM counted no local hit)"}
    else:
        ttft_local = statistics.median(samples["local_hit"])
        local = {"status": "ok", "reason": None}
    example_doc = _example_summary(example_runs)
    ttft_example = example_doc.get("ttft_hit_s")
    over_local = _ratio(ttft_hit, ttft_local)
    over_example = _ratio(ttft_hit, ttft_example)
    return {
        "prompt_tokens": length,
        "rounds": rounds,
        "ttft_recompute_s": ttft_miss,
        "ttft_pool_hit_s": ttft_hit,
        "speedup": ttft_miss / ttft_hit if ttft_hit else None,
        "ttft_reduction_pct": 100.0 * (1 - ttft_hit / ttft_miss) if ttft_miss else None,
        "loaded_tokens_per_hit": sum(loaded) / len(loaded) if loaded else 0.0,
        "expected_loaded_tokens": (length - 1) // block_size * block_size,
        "same_tokens": same and example_doc.get("same_tokens") is not False,
        "ttft_local_hit_s": ttft_local,
        "local_hit": local,
        "ttft_example_hit_s": ttft_example,
        "example_connector": example_doc,
        "ratios": {
            "pool_hit_over_local_hit": over_local,
            "pool_hit_over_example_hit": over_example,
        },
        "targets": {
            "pool_hit_over_local_hit_max": LOCAL_RATIO_TARGET,
            "local_met": None if over_local is None else over_local <= LOCAL_RATIO_TARGET,
            "example_met": None if over_example is None else over_example < 1.0,
        },
        "token_sources": totals,
        "honest": honest,
        "metadata": serving_stats.summarize_hits(hit_changes, ttft_hit),
        "save_metadata": serving_stats.summarize_saves(save_changes),
        "breakdown": serving_stats.breakdown(ttft_hit, ttft_local, hit_changes),
        "paired": _paired(
            samples["pool_hit"],
            samples["local_hit"] if ttft_local is not None else None,
            [x["hit_s"] for x in example_runs if x["status"] == "ok"] if ttft_example is not None else None,
        ),
        "samples": {
            "recompute_s": samples["recompute"],
            "pool_hit_s": samples["pool_hit"],
            "local_hit_s": samples["local_hit"],
            "example_hit_s": [x["hit_s"] for x in example_runs if x["status"] == "ok"],
        },
    }


def _paired(pool: list[float], local: list[float] | None, example: list[float] | None) -> dict[str, Any] | None:
    """The baselines round by round. Each round times the three hits one after the other, so a
    slow stretch of the machine (2 shared cores swing by tens of percent) lands on all three; the
    medians of the per-round differences and ratios see through it better than a ratio of medians."""
    out: dict[str, Any] = {}
    if local and len(local) == len(pool):
        out["pool_above_local_ms"] = 1e3 * statistics.median(p - x for p, x in zip(pool, local, strict=True))
        if example and len(example) == len(pool):
            out["example_above_local_ms"] = 1e3 * statistics.median(e - x for e, x in zip(example, local, strict=True))
    if example and len(example) == len(pool):
        out["pool_over_example_per_round"] = statistics.median(p / e for p, e in zip(pool, example, strict=True) if e)
        out["rounds_pool_faster"] = sum(p < e for p, e in zip(pool, example, strict=True))
        out["rounds"] = len(pool)
    return out or None


def _example_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if not runs:
        return {"status": "not measured", "reason": "not asked for (--example-connector)"}
    failed = next((x for x in runs if x["status"] != "ok"), None)
    if failed is not None:
        # One failure is the answer: a connector that fails on some prompts gets no number.
        return {"status": "fails", "reason": failed["reason"], "failed_on": failed.get("failed_on")}
    hits = [x["hit_s"] for x in runs]
    return {
        "status": "ok",
        "reason": None,
        "ttft_hit_s": statistics.median(hits),
        "ttft_save_s": statistics.median([x["save_s"] for x in runs]),
        "loaded_tokens_per_hit": _median([x["loaded_tokens"] for x in runs if x["loaded_tokens"] is not None]),
        "same_tokens": all(x.get("same_tokens", True) for x in runs),
    }
