"""`bench kv` end to end on small sizes (correctness of the run, not speed) and `bench` argument checks."""

from __future__ import annotations

import json

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
