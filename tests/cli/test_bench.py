"""`bench kv` end to end on small sizes (correctness of the run, not speed) and `bench` argument checks."""

from __future__ import annotations

import json

import pytest

from belugactl.cli.app import run


def test_bench_kv_json_reports_every_method_and_a_good_round_trip(capsys) -> None:
    assert run(["bench", "kv", "--blocks", "2", "--repeat", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shape"]["pieces_per_block"] == 128  # 64 layers x (K, V)
    assert doc["shape"]["piece_bytes"] == 32 * 1024
    assert doc["shape"]["block_bytes"] == 4 * 1024 * 1024
    assert doc["bytes"] == 2 * 4 * 1024 * 1024
    assert set(doc["results"]) == {"contiguous", "contiguous_read", "per_piece", "save", "load"}
    assert all(r["gb_per_s"] > 0 for r in doc["results"].values())
    assert doc["round_trip_ok"] is True


def test_bench_arguments_are_checked_before_any_work(capsys) -> None:
    assert run(["bench", "kv", "--device", "tpu"]) == 2
    assert "expected cpu or cuda" in capsys.readouterr().err
    assert run(["bench", "kv", "--coherence", "maybe"]) == 2
    assert run(["bench", "serve", "-f", "examples/cpu-demo.yaml", "--lengths", "10,x"]) == 2
    assert "expected integers" in capsys.readouterr().err
    assert run(["bench", "serve", "-f", "examples/cpu-demo.yaml", "--lengths", "8"]) == 2


@pytest.mark.process
@pytest.mark.native
def test_bench_rpc_lookup_keys_and_idle_ms_time_each_operation_after_each_pause(capsys) -> None:
    argv = ["bench", "rpc", "--samples", "50", "--seconds", "0.01", "--no-pin"]
    argv += ["--lookup-keys", "8", "--idle-ms", "0,2", "--lookup-rounds", "2", "--json"]
    assert run(argv) == 0
    doc = json.loads(capsys.readouterr().out)["lookups"]
    assert doc["keys"] == 8
    assert doc["get_many_messages"] >= 1
    assert doc["idle_ms"] == ["0", "2"]
    assert doc["baseline_idle_ms"] == "0"
    for op in ("lookup", "release", "release_nowait"):
        assert all(doc["median_us"][op][ms] > 0 for ms in ("0", "2")), op
        assert doc["over_baseline"][op]["2"] > 0, op
    assert doc["nowait_refused"] == 0


@pytest.mark.process
def test_bench_rpc_without_lookup_options_measures_no_lookups(capsys) -> None:
    assert run(["bench", "rpc", "--samples", "50", "--seconds", "0.01", "--no-pin", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lookups"] is None


@pytest.mark.process
def test_bench_mds_idle_prints_the_idle_wait_beside_busy_polling(capsys) -> None:
    argv = ["bench", "mds", "--ops", "1000", "--batch-rounds", "0", "--idle", "--idle-rings", "6"]
    assert run([*argv, "--idle-seconds", "0.2", "--idle-pings", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["idle_server"]
    assert doc["rings"] == 6
    assert doc["idle_wait"]["spin_after_ms"] == 0
    assert doc["busy_poll"]["spin_after_ms"] > 0
    for name in ("idle_wait", "busy_poll"):
        assert doc[name]["cpu_share"] >= 0
        assert 0 < doc[name]["ping_us"]["p10"] <= doc[name]["ping_us"]["p50"] <= doc[name]["ping_us"]["p90"]
    assert set(doc["idle_wait_over_busy_poll"]) == {"cpu_share", "ping_p50_us"}


def test_bench_rpc_and_mds_options_are_checked_before_any_work(capsys) -> None:
    assert run(["bench", "rpc", "--idle-ms", "0,x"]) == 2
    assert "expected numbers" in capsys.readouterr().err
    assert run(["bench", "rpc", "--idle-ms", "-1"]) == 2
    assert run(["bench", "rpc", "--lookup-keys", "5000"]) == 2
    assert run(["bench", "rpc", "--lookup-keys", "8", "--lookup-rounds", "0"]) == 2
    assert run(["bench", "mds", "--idle", "--idle-rings", "2"]) == 2
    assert run(["bench", "mds", "--idle", "--idle-pings", "0"]) == 2
