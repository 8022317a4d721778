"""The benchmark commands run and report their figures (the figures themselves are not asserted)."""

from __future__ import annotations

import json

import pytest

from belugactl.cli.app import run


@pytest.mark.timeout(120)
def test_bench_mds_json(capsys) -> None:
    argv = ["bench", "mds", "--ops", "3000", "--batch-blocks", "62", "--batch-rounds", "2", "--no-pin", "--json"]
    assert run(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "mds"
    # A 62-block save both ways on a real server: the batched burst's message counts are the protocol's.
    batched = doc["batched_puts"]
    assert batched["blocks_per_save"] == 62 and batched["rounds"] == 2
    for transport, messages in (("cxl", 13 + 5), ("tcp", 2)):
        side = batched[transport]
        assert side["single"]["messages_per_save"] == side["single"]["round_trips_per_save"] == 2 * 62
        assert side["batched"]["messages_per_save"] == messages and side["batched"]["round_trips_per_save"] == 2
        assert side["single"]["server_us_per_save"] > 0 and side["batched"]["server_us_per_save"] > 0
        assert side["batched_over_single"] == round(
            side["batched"]["block_puts_per_s"] / side["single"]["block_puts_per_s"], 2
        )
    assert sum(doc["index"]["mix"].values()) == 3000 and doc["index"]["ops_per_s"] > 0
    assert 0 < doc["allocator_churn"]["live_bytes_over_area_peak"] <= 1
    il = doc["interleave"]  # same traffic with and without software interleave over 4 zones
    assert il["ways"] == 4 and len(il["software"]["placed_zone_bytes"]) == 4
    assert il["software"]["placed_min_over_max"] > 0.9 and il["none"]["placed_zone_bytes"][-1] == 0
    assert il["software"]["zones_spanned_by_16_consecutive_blocks"] == 4
    # Zones are the allocator's own, equal; a 4 MiB block's two granules lie in consecutive zones.
    assert {z["size"] for z in il["zones"]} == {(1 << 30) // 4} and il["unused_bytes"] == 0
    first, second = il["software"]["zones_of_a_4mib_block_by_granule"]
    assert second == (first + 1) % 4
    # The index runs on an interleaved allocator too, and says how much it holds in each zone.
    held = doc["index"]["zone_bytes"]
    assert len(held) == 4 and min(held) > 0.9 * max(held)


@pytest.mark.timeout(120)
def test_bench_rpc_json(capsys) -> None:
    assert run(["bench", "rpc", "--samples", "200", "--seconds", "0.02", "--no-pin", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for transport in ("cxl", "tcp"):
        assert doc[transport]["request_bytes"] == 64
        assert doc[transport]["qd1"]["p50_us"] > 0
        assert set(doc[transport]["ops_per_s"]) == {"1", "8", "32", "128"}
    assert set(doc["targets"]) == {"cxl_qd1_p50_us", "tcp_over_cxl_p50", "cxl_qd128_mops"}
    assert doc["ratios"]["tcp_over_cxl_p50"] > 0


def test_bench_checksum_json(capsys) -> None:
    from belugactl.dataplane import native

    assert run(["bench", "checksum", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernel"] == native.CRC32C_KERNEL and doc["native"] is native.AVAILABLE
    (row,) = doc["sizes"]
    assert row["bytes"] == 64 << 10
    assert row["crc32c_gbps"] > 0 and row["copy_gbps"] > 0 and row["copy_crc32c_gbps"] > 0
    assert row["fused_over_copy"] == round(row["copy_crc32c_gbps"] / row["copy_gbps"], 2)
