"""`belugactl bench failover` (issue 32's benchmark): the verdict from made-up figures, the sizes, the
bench rack's manifest (fast), and one small real run whose checker must find a block lost and bytes
changed behind its back (`--faulty`: a real etcd, two standbys, SIGKILLs; process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from belugactl.errors import UsageError
from belugactl.model.journal_sizing import blocks_covered, namespace_bytes
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.bench import failover as fo
from tests.support.etcd import require_etcd


def _row(**over: object) -> dict:
    row = {
        "blocks": 1000, "label": "1k", "first_answer_s": {"p50": 5.2, "max": 6.0, "all": [5.2, 6.0]},
        "committed_blocks_lost": 0, "wrong_reads": 0, "wrong_bytes_served": 0, "sample_blocks": 100,
        "hit_rate_before": 1.0, "hit_rate_after": 1.0,
    }  # fmt: skip
    row.update(over)
    return row


def _failed(row: dict, ttl: int = 5) -> list[str]:
    report = fo.judge({"ttl_s": ttl, "sizes": [row]})
    return [g["goal"] for g in report["goals"] if not g["ok"]] + (["failed"] if report["failed"] else [])


def test_goals_met_from_figures_within_the_targets() -> None:
    assert _failed(_row()) == []
    assert _failed(_row(first_answer_s={"p50": 7.0, "max": 7.0, "all": [7.0]})) == []  # TTL + 2 s is met


@pytest.mark.parametrize(
    ("over", "goal"),
    [
        (
            {"first_answer_s": {"p50": 5.2, "max": 7.01, "all": [5.2, 7.01]}},
            "1k: first answer after the kill (p50 / max)",
        ),
        ({"committed_blocks_lost": 1}, "1k: committed blocks lost"),
        ({"wrong_reads": 1, "wrong_bytes_served": 16}, "1k: wrong bytes served (100 blocks read back a kill)"),
        ({"hit_rate_after": 0.999}, "1k: hit rate after failover (worst kill)"),
    ],
)
def test_each_goal_fails_on_its_own_figure(over: dict, goal: str) -> None:
    assert _failed(_row(**over)) == [goal, "failed"]


def test_the_time_target_follows_the_ttl() -> None:
    late = _row(first_answer_s={"p50": 3.0, "max": 4.5, "all": [3.0, 4.5]})
    assert _failed(late, ttl=2) == ["1k: first answer after the kill (p50 / max)", "failed"]
    assert _failed(late, ttl=3) == []


def test_sizes_parse_with_suffixes_and_refuse_the_rest() -> None:
    assert fo.parse_sizes("100k,1M") == (100_000, 1_000_000)
    assert fo.parse_sizes(" 200 , 1.5k") == (200, 1500)
    for bad in ("", "0", "1G", "abc", "100k,,1M", "-5"):
        with pytest.raises(UsageError, match="--blocks"):
            fo.parse_sizes(bad)
    assert [fo.size_label(n) for n in (200, 100_000, 1_000_000, 1500)] == ["200", "100k", "1M", "1500"]


@pytest.mark.parametrize("blocks", [200, 100_000, 1_000_000])
def test_the_bench_rack_holds_the_blocks_and_its_journal_covers_them(blocks: int) -> None:
    m = load_manifest_text(fo.failover_manifest(blocks))
    md = m.layout.metadata
    kv = m.layout.shared_kv
    assert kv >= blocks * fo.BLOCK * fo.KV_HEADROOM  # far below the eviction watermark
    assert blocks_covered(md.journal, namespace_bytes(m.name, 1)) >= kv // fo.BLOCK


def test_the_sample_spreads_over_the_blocks() -> None:
    assert fo.sample_indices(200, 1000) == list(range(200))
    s = fo.sample_indices(1_000_000, 1000)
    assert len(s) == 1000 and s[0] == 0 and s[-1] >= 999_000


class _CountingClient:
    """GET_MANY over a set of committed keys; records the leases handed back."""

    def __init__(self, committed: set[bytes]) -> None:
        self.committed = committed
        self.released: list[int] = []
        self.calls = 0

    def get_many_tuples(self, ns: str, keys: list[bytes]) -> list:
        self.calls += 1
        return [([(0, 4096)], 7, 4096, 0) if k in self.committed else None for k in keys]

    def release(self, ids: list[int]) -> int:
        self.released += ids
        return len(ids)


def test_hits_are_counted_key_by_key_in_bursts() -> None:
    keys = [fo.key_of(i) for i in range(10_000)]
    c = _CountingClient({k for i, k in enumerate(keys) if i % 3})
    assert fo.count_hits(c, keys) == sum(1 for i in range(10_000) if i % 3)
    assert c.calls == 3 and len(c.released) == fo.count_hits(_CountingClient(c.committed), keys)


@pytest.mark.process
def test_a_small_run_finds_the_block_lost_and_the_bytes_changed_behind_its_back() -> None:
    require_etcd()
    argv = [
        sys.executable, "-m", "belugactl", "bench", "failover", "--kills", "2", "--blocks", "200", "--ttl", "2",
        "--json", "--faulty",
    ]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240)  # noqa: S603
    assert p.returncode == 1, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert (r["kills"], r["ttl_s"], r["target_s"], r["failed"]) == (2, 2, 4.0, True)
    (row,) = r["sizes"]
    fa = row["first_answer_s"]
    assert len(fa["all"]) == 2 and 0 < fa["p50"] <= fa["max"] == max(fa["all"])
    assert row["hit_rate_before"] == 1.0 and row["hit_rate_after"] == 199 / 200
    assert row["committed_blocks_lost"] == 1  # the deleted block, once, though it misses at both kills
    assert (row["wrong_reads"], row["wrong_bytes_served"]) == (2, 2 * 16)  # the changed block, at each kill
    assert row["sample_blocks"] == 200 and row["restored_entries"] in (199, 200)
    assert len(row["takeover_rebuild_s"]["all"]) == 2
    assert row["standby"] == "warm" and row["warm_takeovers"] == 2  # each standby's copy, not a rebuild
    assert len(row["standby_catch_up_s"]["all"]) == 2
    assert row["start_empty"]["hit_rate_after"] == 0.0 and row["start_empty"]["committed_blocks_lost"] == 200
    goals = {g["goal"]: g["ok"] for g in r["goals"]}
    assert goals == {
        "200: first answer after the kill (p50 / max)": fa["max"] <= 4.0,  # judged from the figure measured
        "200: committed blocks lost": False,
        "200: wrong bytes served (200 blocks read back a kill)": False,
        "200: hit rate after failover (worst kill)": False,
    }


def test_bad_flags_exit_2_with_what_why_fix_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cli.conftest import invoke

    monkeypatch.setattr(fo, "run_size", lambda *a, **k: pytest.fail("nothing may start on bad flags"))
    for flags, words in (
        (["--blocks", "1G"], ["--blocks", "not a block count", "--blocks 100k,1M"]),
        (["--ttl", "1"], ["--ttl 1", "2..60", "--ttl 5"]),
        (["--kills", "0"], ["--kills 0", "at least 1"]),
    ):
        r = invoke("bench", "failover", *flags)
        assert r.code == 2 and all(w in r.stderr for w in words), (flags, r.stderr)


def test_a_size_that_cannot_be_measured_is_reported_and_the_others_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager

    from belugactl.errors import EnvironmentProblem
    from belugactl.workflows.bench import etcd_local

    def run_size(cfg, blocks, etcd, tmp, say):  # noqa: ANN001, ANN202
        if blocks == 2000:
            raise EnvironmentProblem("a metadata server printed no record within 65 s", why="its log")
        return _row(blocks=blocks, label=fo.size_label(blocks))

    @contextmanager
    def no_etcd():  # noqa: ANN202
        yield type("E", (), {"url": "http://127.0.0.1:1"})()

    monkeypatch.setattr(fo, "run_size", run_size)
    monkeypatch.setattr(etcd_local, "local_etcd", no_etcd)
    r = fo.run_failover(fo.FailoverConfig(sizes=(1000, 2000)))
    first, second = r["sizes"]
    assert first["blocks"] == 1000 and "error" not in first
    assert second == {
        "blocks": 2000,
        "label": "2k",
        "error": "a metadata server printed no record within 65 s (its log)",
    }
    assert r["failed"] and [g["goal"] for g in r["goals"] if not g["ok"]] == ["2k: measured"]
