"""`bench serve` against fake vLLM servers on loopback (real HTTP): the baselines table, the
ExampleConnector's failure, the concurrent pass and the connector-stats arithmetic all come from
what was measured (the fakes' costs are changed between runs and the results follow)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from belugactl.workflows.bench import serving as bench_serve
from belugactl.workflows.bench import serving_engines as engines
from belugactl.workflows.bench import serving_stats
from belugactl.workflows.bench.serving_baselines import ExampleInstance, failure_reason
from belugactl.workflows.bench.serving_report import baseline_lines
from belugactl.workflows.serve import traffic
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from tests.support.fake_vllm import Costs, EngineClock, FakeRack, FakeVLLM

LENGTH = 640  # 19 full blocks of 32 are loadable (the last token is always computed)


class Stack:
    def __init__(
        self, tmp: Path, costs: Costs, clock: EngineClock, *, b_cache: bool = True, chunk: int | None = None
    ) -> None:
        self.rack = FakeRack()
        self.tmp = tmp
        self.stats_a, self.stats_b = tmp / "stats" / "vllm-0", tmp / "stats" / "vllm-1"
        self.a = FakeVLLM(self.rack, costs=costs, stats_prefix=self.stats_a, clock=clock)
        self.b = FakeVLLM(self.rack, prefix_cache=b_cache, costs=costs, stats_prefix=self.stats_b, clock=clock)
        self.log = tmp / "example.log"
        self.log.write_text("")
        self.example = FakeVLLM(
            self.rack, prefix_cache=True, connector="example", costs=costs, log_file=self.log, chunk=chunk, clock=clock
        )

    def close(self) -> None:
        for s in (self.a, self.b, self.example):
            s.close()

    def run(self, **kw: object) -> dict:
        args: dict = dict(
            lengths=[LENGTH],
            rounds=2,
            settle_s=0.0,
            local_hit=True,
            stats_a=str(self.stats_a),
            stats_b=str(self.stats_b),
            example=ExampleInstance(self.example.port, str(self.log)),
        )
        args.update(kw)
        return bench_serve.run(self.a.port, self.b.port, **args)


@pytest.fixture
def make_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    # The fakes write their stats files at once; the real connector's lag of up to 0.2 s needs no wait here.
    monkeypatch.setattr(bench_serve, "STATS_LAG_S", 0.0)
    # The client times each request by the fakes' engine clock: what the costs say, not the machine's load.
    clock = EngineClock()
    monkeypatch.setattr(
        traffic, "time", SimpleNamespace(perf_counter=clock.now, monotonic=time.monotonic, sleep=time.sleep)
    )

    made: list[Stack] = []

    def make(costs: Costs, name: str = "s", **kw: object) -> Stack:
        (tmp_path / name).mkdir()
        stack = Stack(tmp_path / name, costs, clock, **kw)
        made.append(stack)
        return stack

    yield make
    for s in made:
        s.close()


def test_the_table_puts_every_baseline_beside_the_pool_hit_from_what_was_timed(make_stack) -> None:
    stack = make_stack(Costs(pool_s=0.06, local_s=0.01, example_s=0.12))
    doc = stack.run()
    row = doc["rows"][0]
    # Each timed request got its KV where it claims (vLLM's own counts), and none other.
    assert row["honest"] == {"recompute": True, "pool_hit": True, "local_hit": True}
    wheres = [(r["salt"].split("-")[0], r["where"]) for r in stack.b.requests]
    assert sorted(set(wheres)) == [("pool", "pool"), ("recompute", "compute"), ("recompute", "local")]
    assert row["token_sources"]["pool_hit"]["external_kv_transfer"] == 2 * 608
    assert row["loaded_tokens_per_hit"] == row["expected_loaded_tokens"] == 608
    # The numbers are the medians of the samples, and the ratios are theirs.
    assert row["ttft_local_hit_s"] == pytest.approx(sorted(row["samples"]["local_hit_s"])[0] / 2 + sorted(
        row["samples"]["local_hit_s"])[1] / 2)  # fmt: skip
    assert row["ttft_recompute_s"] >= LENGTH * 0.0005
    assert row["ttft_pool_hit_s"] >= 0.06 and row["ttft_local_hit_s"] >= 0.01 and row["ttft_example_hit_s"] >= 0.12
    assert row["ratios"]["pool_hit_over_local_hit"] == pytest.approx(row["ttft_pool_hit_s"] / row["ttft_local_hit_s"])
    assert row["ratios"]["pool_hit_over_example_hit"] == pytest.approx(
        row["ttft_pool_hit_s"] / row["ttft_example_hit_s"]
    )
    assert row["ratios"]["pool_hit_over_example_hit"] < 1.0 and row["targets"]["example_met"] is True
    assert row["ratios"]["pool_hit_over_local_hit"] > 1.5 and row["targets"]["local_met"] is False
    assert row["example_connector"]["status"] == "ok" and row["example_connector"]["same_tokens"] is True
    assert row["same_tokens"] is True
    # The ExampleConnector's hit came from its files, under a salt its local cache never saw.
    assert [r["where"] for r in stack.example.requests] == ["compute", "example"] * 2
    text = "\n".join(baseline_lines(doc))
    assert f"{row['ttft_local_hit_s']:.3f}s" in text and f"{row['ratios']['pool_hit_over_local_hit']:.2f}x" in text
    # Round by round: each round's pool hit against that round's local and ExampleConnector hits.
    paired, sm = row["paired"], row["samples"]
    rounds = list(zip(sm["pool_hit_s"], sm["local_hit_s"], sm["example_hit_s"], strict=True))
    assert paired["rounds"] == 2 and paired["rounds_pool_faster"] == sum(p < e for p, _, e in rounds)
    assert paired["pool_above_local_ms"] == pytest.approx(1e3 * sum(p - lo for p, lo, _ in rounds) / 2)
    assert paired["example_above_local_ms"] == pytest.approx(1e3 * sum(e - lo for _, lo, e in rounds) / 2)
    assert paired["pool_over_example_per_round"] == pytest.approx(sum(p / e for p, _, e in rounds) / 2)
    assert f"the pool faster in {paired['rounds_pool_faster']} of 2 rounds" in text

    # Other costs, other results: nothing in the table is fixed.
    other = make_stack(Costs(pool_s=0.01, local_s=0.08, example_s=0.005), name="t").run()["rows"][0]
    assert other["ratios"]["pool_hit_over_local_hit"] < 1.0 and other["targets"]["local_met"] is True
    assert other["ratios"]["pool_hit_over_example_hit"] > 1.0 and other["targets"]["example_met"] is False
    # Counted from the samples, not assumed from the costs: 5 ms apart, a loaded machine can swap a round.
    osm = other["samples"]
    pairs = list(zip(osm["pool_hit_s"], osm["example_hit_s"], strict=True))
    assert other["paired"]["rounds_pool_faster"] == sum(p < e for p, e in pairs)
    assert other["paired"]["pool_over_example_per_round"] == pytest.approx(sum(p / e for p, e in pairs) / 2)


def test_an_example_connector_that_fails_is_reported_as_fails_with_the_reason_not_a_number(make_stack) -> None:
    stack = make_stack(Costs(), chunk=512)
    doc = stack.run(lengths=[256, LENGTH])
    short, long_ = doc["rows"]
    assert short["example_connector"]["status"] == "ok" and short["ttft_example_hit_s"] is not None
    ex = long_["example_connector"]
    assert ex["status"] == "fails" and long_["ttft_example_hit_s"] is None
    assert ex["reason"].startswith("RuntimeError: shape mismatch") and "[512, 2, 64]" in ex["reason"]
    assert long_["ratios"]["pool_hit_over_example_hit"] is None and long_["targets"]["example_met"] is None
    assert long_["samples"]["example_hit_s"] == []
    # The dead engine is not asked again in the second round; the pool's numbers are unaffected.
    assert len([r for r in stack.example.requests if r["tokens"] == LENGTH]) == 2
    assert len(long_["samples"]["pool_hit_s"]) == 2 and long_["honest"]["pool_hit"] is True
    line = next(x for x in baseline_lines(doc) if x.lstrip().startswith(str(LENGTH)))
    assert line.endswith(f"fails: {ex['reason']}")


def test_a_local_hit_that_is_not_one_is_not_reported_as_the_floor(make_stack) -> None:
    stack = make_stack(Costs(), b_cache=False)
    row = stack.run(example=None, rounds=1)["rows"][0]
    assert row["local_hit"]["status"] == "not measured" and row["ttft_local_hit_s"] is None
    assert row["honest"]["local_hit"] is False and row["breakdown"] is None
    assert row["example_connector"]["status"] == "not measured"
    off = stack.run(example=None, rounds=1, local_hit=False)["rows"][0]
    assert "prefix cache off" in off["local_hit"]["reason"] and off["samples"]["local_hit_s"] == []


def test_metadata_per_hit_and_the_breakdown_come_from_the_connectors_stats(make_stack) -> None:
    costs = Costs(lookup_us=150, load_metadata_us=250, load_us=2000, save_metadata_us=700)
    stack = make_stack(costs)
    row = stack.run(example=None)["rows"][0]
    meta = row["metadata"]
    # Each pool hit: one lookup on B's scheduler and one locate on its worker (the recompute and the
    # local hit have the connector off: they add nothing).
    assert meta["per_request_us"] == [400, 400]
    assert meta["by_key_median_us"] == {"scheduler.lookup_us": 150, "worker0.load_metadata_us": 250}
    assert meta["share_of_pool_hit_pct"] == pytest.approx(100 * 400 / (row["ttft_pool_hit_s"] * 1e6))
    assert meta["met"] is (meta["share_of_pool_hit_pct"] < 1.0)
    # A's compute-and-save: its own lookup (a miss) and the save's reserve and commit.
    assert row["save_metadata"]["per_request_us"] == [850, 850] and row["save_metadata"]["round_trips"] == [2, 2]
    brk = row["breakdown"]
    assert brk["metadata_ms"] == pytest.approx(0.4) and brk["copy_ms"] == pytest.approx(2.0)
    assert brk["copy_wait_ms"] is None  # no layer-wise loads reported: the whole copy is on the path
    assert brk["beyond_floor_ms"] == pytest.approx((row["ttft_pool_hit_s"] - row["ttft_local_hit_s"]) * 1e3)
    assert brk["unattributed_ms"] == pytest.approx(brk["beyond_floor_ms"] - 0.4 - 2.0)
    assert brk["missing_stats"] == {}


def test_the_pool_hit_waits_for_a_save_that_finishes_after_the_answer(make_stack) -> None:
    # Asynchronous saves: A answers 0.5 s before its blocks are in the pool. The bench waits for A's
    # save (its stats files) before timing B, so every pool hit is one.
    stack = make_stack(Costs(save_delay_s=0.5))
    doc = stack.run(example=None, rounds=2, concurrent=2, concurrent_length=LENGTH)
    row = doc["rows"][0]
    assert row["honest"]["pool_hit"] is True and row["loaded_tokens_per_hit"] == 608
    assert doc["concurrent"]["pool_hit"]["token_sources"]["external_kv_transfer"] == 2 * 608


def test_stats_arithmetic() -> None:
    before = {"scheduler": {"lookup_us": 100, "lookups": 1}, "worker0": {"load_us": 10}}
    after = {
        "scheduler": {"lookup_us": 350, "lookups": 2, "locate_us": 40},
        "worker0": {"load_us": 510, "load_metadata_us": 60, "load_metadata_round_trips": 1, "saved_blocks": 0},
    }
    change = serving_stats.delta(before, after)
    assert change == {
        "scheduler": {"lookup_us": 250, "lookups": 1, "locate_us": 40},
        "worker0": {"load_us": 500, "load_metadata_us": 60, "load_metadata_round_trips": 1},
    }
    meta = serving_stats.metadata_of(change)
    assert meta["us"] == 350 and meta["round_trips"] == 1  # load_us is the copy, lookups a count
    assert serving_stats.copy_us(change) == 500
    hits = serving_stats.summarize_hits([change, serving_stats.delta({}, {"scheduler": {"lookup_us": 50}})], 0.05)
    assert hits["per_request_us"] == [350, 50] and hits["median_us"] == 200
    assert hits["share_of_pool_hit_pct"] == pytest.approx(0.4) and hits["met"] is True
    brk = serving_stats.breakdown(0.05, 0.02, [change])
    assert brk is not None and brk["unattributed_ms"] == pytest.approx(30 - 0.35 - 0.5)
    assert brk["missing_stats"] == {}
    # Layer-wise loads: only the forward's wait for the copy is on the critical path.
    layered = serving_stats.delta(before, {**after, "worker0": {**after["worker0"], "layer_wait_us": 200}})
    brk = serving_stats.breakdown(0.05, 0.02, [layered])
    assert brk is not None and brk["copy_wait_ms"] == pytest.approx(0.2)
    assert brk["unattributed_ms"] == pytest.approx(30 - 0.35 - 0.2)
    assert serving_stats.saves_done({"worker0": {"save_requests": 3}, "worker1": {"save_requests": 2}}) == 5
    assert serving_stats.read_counters(None) == {}


def test_the_concurrent_pass_compares_throughput_pool_vs_recompute(make_stack) -> None:
    stack = make_stack(Costs(per_token_s=0.0008, pool_s=0.005))
    doc = stack.run(example=None, rounds=1, concurrent=4, concurrent_length=LENGTH)
    conc = doc["concurrent"]
    rec, hit = conc["recompute"], conc["pool_hit"]
    assert conc["prompts"] == 4 and conc["same_tokens"] is True
    assert hit["token_sources"]["external_kv_transfer"] == 4 * 608 and hit["token_sources"]["local_cache_hit"] == 0
    assert rec["token_sources"]["external_kv_transfer"] == 0 and rec["token_sources"]["local_cache_hit"] == 0
    assert rec["requests_per_s"] == pytest.approx(4 / rec["wall_s"]) and rec["wall_s"] >= 4 * LENGTH * 0.0008
    assert conc["throughput_ratio"] == pytest.approx(hit["requests_per_s"] / rec["requests_per_s"])
    assert conc["throughput_ratio"] > 3.0 and conc["met"] is True
    assert hit["metadata_us_per_request"] == pytest.approx(120 + 80)
    # B's pool pass found every prompt in the pool, its recompute none in its cache.
    conc_b = stack.b.requests[-8:]
    assert sorted(r["where"] for r in conc_b) == ["compute"] * 4 + ["pool"] * 4
    assert "concurrent: 4 prompts" in "\n".join(baseline_lines(doc))


def test_the_routed_pool_hit_uses_blocks_no_cache_holds(make_stack) -> None:
    stack = make_stack(Costs())
    doc = stack.run(example=None, rounds=1, router_port=stack.b.port)
    routed = doc["rows"][0]["via_router"]
    assert routed["ttft_pool_hit_s"] >= 0.06
    assert [r["where"] for r in stack.b.requests[-2:]] == ["compute", "pool"]


def test_engine_settings_rewrite_only_the_engine_flags() -> None:
    argv = ("vllm", "serve", "M", "--port", "8101", "--kv-transfer-config", "{}", "--no-enable-prefix-caching")
    assert engines.engine_argv(argv, max_batched_tokens=4096, prefix_caching=True) == (
        *argv[:7], "--max-num-batched-tokens", "4096", "--enable-prefix-caching")  # fmt: skip
    assert engines.engine_argv((*argv, "--max-num-batched-tokens=512"), max_batched_tokens=None) == argv
    assert not engines.prefix_caching_on(argv) and engines.prefix_caching_on(argv[:7])
    assert engines.parse_settings("both") == ["default", "4096"]
    with pytest.raises(Exception, match="unknown"):
        engines.parse_settings("8k")
    specs = [
        ProcessSpec(f"vllm-{i}", "vllm", (*argv[:4], str(8100 + i), *argv[5:]), {"PYTHONHASHSEED": "0"}, "l", 8100 + i)
        for i in range(2)
    ]
    server = ProcessSpec("metadata-server", "metadata", ("b",), {}, "l")
    plan = ServePlan("r", "h", "m", "/run", "/pool", [server, *specs])
    p4096 = engines.plan_for_setting(plan, "4096", local_cache_on="vllm-1")
    a, b = p4096.processes[1], p4096.processes[2]
    assert "--max-num-batched-tokens" in a.argv and not engines.prefix_caching_on(a.argv)
    assert engines.prefix_caching_on(b.argv) and plan.processes[2].argv == specs[1].argv  # the base plan is untouched
    ex = engines.example_connector_spec(b, port=9999, storage=Path("/tmp/kv"), log_file=Path("/tmp/ex.log"))
    assert ex.argv[:5] == ("vllm", "serve", "M", "--port", "9999") and "8101" not in ex.argv
    config = ex.argv[ex.argv.index("--kv-transfer-config") + 1]
    assert '"ExampleConnector"' in config and '"kv_both"' in config and "/tmp/kv" in config
    assert ex.argv.count("--kv-transfer-config") == 1 and ex.env == b.env and ex.stats_prefix is None
    assert [x for x in ex.argv if x.startswith("--") and x not in ("--port", "--kv-transfer-config")] == [
        x for x in b.argv if x.startswith("--") and x not in ("--port", "--kv-transfer-config")
    ]


def test_failure_reason_prefers_the_logged_cause(tmp_path: Path) -> None:
    from belugactl.errors import EnvironmentProblem

    log = tmp_path / "x.log"
    log.write_text("RuntimeError: old failure\n")
    mark = log.stat().st_size
    with log.open("a") as fh:
        fh.write("  File x\nValueError: bad thing happened\nEngineDeadError: EngineCore encountered an issue.\n")
    err = EnvironmentProblem("vLLM on port 1 refused a completion: HTTP 500", why="Internal Server Error")
    assert failure_reason(err, str(log), since=mark) == "ValueError: bad thing happened"
    assert failure_reason(err, None) == "vLLM on port 1 refused a completion: HTTP 500 (Internal Server Error)"


def test_cli_refuses_an_unknown_engine_setting() -> None:
    from belugactl.cli.app import run

    assert run(["bench", "serve", "-f", "examples/cpu-demo.yaml", "--engine-setting", "8k"]) == 2
    assert run(["bench", "serve", "-f", "examples/cpu-demo.yaml", "--concurrent", "-1"]) == 2


def test_the_printed_table_keeps_the_old_lines_and_adds_the_baselines(make_stack, capsys) -> None:
    from belugactl.cli.bench_serving_cmd import print_table

    doc = make_stack(Costs(), chunk=512).run(rounds=1)
    doc["engine_setting"], doc["engine_setting_label"] = "default", "default chunked prefill"
    print_table(doc)
    out = capsys.readouterr().out.splitlines()
    row = doc["rows"][0]
    assert out[0] == "engine setting: default chunked prefill"
    assert out[1].split() == ["prompt", "recompute", "pool", "hit", "speedup", "reduction", "same", "tokens"]
    assert out[2].split()[:3] == [str(LENGTH), f"{row['ttft_recompute_s']:.3f}s", f"{row['ttft_pool_hit_s']:.3f}s"]
    assert out[3].startswith("paper (Beluga, GPU, CXL): 89.6 % lower TTFT")
    assert any(line.endswith(f"fails: {row['example_connector']['reason']}") for line in out)
    assert any("connector metadata per pool hit" in line for line in out)
