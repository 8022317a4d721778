"""`bench soak` on a real metadata-server process: a short run with a restart, client kills and
eviction serves no wrong byte, and a run with a buggy writer is caught (so the checker can fail)."""

from __future__ import annotations

import pytest

from belugactl.cli.app import run
from belugactl.workflows.bench.soak import SIZES, SoakConfig, block_bytes, key_of, run_soak, size_of, wrong_bytes

pytestmark = pytest.mark.timeout(180)


def test_checker_sees_a_foreign_page_a_moved_page_and_another_key() -> None:
    key = next(key_of(i) for i in range(100) if size_of(key_of(i)) == 700_000)
    good = block_bytes(key, 7, 700_000)
    assert len(good) == 700_000 and wrong_bytes(key, good, 700_000) == 0
    other_writer = block_bytes(key, 8, 700_000)
    assert wrong_bytes(key, good[:8192] + other_writer[8192:], 700_000) > 0
    moved = good[:4096] + good[8192:12288] + good[4096:8192] + good[12288:]
    assert wrong_bytes(key, moved, 700_000) > 0
    flipped = bytearray(good)
    flipped[-1] ^= 1
    assert wrong_bytes(key, bytes(flipped), 700_000) == 1
    other_key = next(key_of(i) for i in range(100, 300) if size_of(key_of(i)) == 700_000)
    assert wrong_bytes(other_key, good, 700_000) > 0
    assert wrong_bytes(key, good[:-1], 700_000) > 0
    assert len(set(size_of(key_of(i)) for i in range(200))) == len(SIZES)


def test_soak_with_restart_and_kills_serves_no_wrong_byte(tmp_path) -> None:
    cfg = SoakConfig(seconds=11, writers=2, readers=2, keys=40, kv_mib=16, restart_every_s=3, kill_every_s=1.5)
    r = run_soak(cfg, workdir=tmp_path)
    assert r["wrong_reads"] == 0 and r["wrong_bytes"] == 0, r["wrong_examples"]
    assert r["committed"] > 0 and r["reads_verified"] > 0
    assert r["server_restarts"] >= 1 and r["restarts_survived"] >= 1
    assert r["client_kills"] >= 2
    assert r["evictions"] > 0  # 40 keys of up to 2.5 MiB in a 16 MiB area


def test_soak_catches_a_writer_that_writes_wrong_bytes(tmp_path, capsys) -> None:
    argv = ["bench", "soak", "--seconds", "5", "--writers", "1", "--readers", "2", "--keys", "20", "--kv-mib", "64",
            "--restart-every", "0", "--kill-every", "0", "--faulty-writer", "--json"]  # fmt: skip
    code = run(argv)
    assert code == 1
    assert '"wrong_reads": 0' not in capsys.readouterr().out


def test_soak_refuses_bad_bounds() -> None:
    assert run(["bench", "soak", "--seconds", "0"]) == 2
    assert run(["bench", "soak", "--writers", "0"]) == 2


def test_soak_stops_at_its_op_bound(tmp_path) -> None:
    cfg = SoakConfig(seconds=90, ops=150, writers=1, readers=1, keys=20, kv_mib=16, restart_every_s=0, kill_every_s=0)
    r = run_soak(cfg, workdir=tmp_path)
    assert r["ops"] >= 150 and r["seconds"] < 60 and r["wrong_reads"] == 0


def test_stalled_writers_overwrites_are_caught_never_served(tmp_path) -> None:
    # Writers stall 0.5..8 s between their fence check and their stores, past a 1 s TTL: their
    # stores land on blocks committed since (a few a run; the hostile suite pins the case itself).
    # Readers must catch every one by checksum.
    cfg = SoakConfig(
        seconds=14, writers=4, readers=2, keys=16, kv_mib=16, restart_every_s=0, kill_every_s=0,
        stall_writers=0.3, reservation_ttl_s=1.0,
    )  # fmt: skip
    r = run_soak(cfg, workdir=tmp_path)
    assert r["wrong_bytes_served"] == 0 and r["wrong_reads"] == 0, r["wrong_examples"]
    assert r["committed"] > 0 and r["reads_verified"] > 0


@pytest.mark.process
def test_elected_soak_through_leader_kills_serves_no_wrong_byte(tmp_path) -> None:
    """Issue 32's soak: a leader and a standby through a real etcd on loopback; the leader SIGKILLed
    again and again, each time the standby takes over (warm) and the killed one comes back as the
    standby; writers and readers on CXL rings and on TCP (both members named) check every byte."""
    from tests.support.etcd import require_etcd

    require_etcd()
    cfg = SoakConfig(
        seconds=26, writers=2, readers=2, keys=40, kv_mib=16, restart_every_s=2.5, kill_every_s=0, elected=True,
    )  # fmt: skip
    r = run_soak(cfg, workdir=tmp_path)
    assert r["wrong_reads"] == 0 and r["wrong_bytes"] == 0, r["wrong_examples"]
    e = r["elected"]
    assert e["leader_changes"] == r["server_restarts"] >= 2
    assert r["restarts_survived"] == r["server_restarts"]  # clients worked again after every takeover
    assert e["takeover_max_s"] < cfg.leader_ttl_s + 10
    assert r["committed"] > 0 and r["reads_verified"] > 0


def test_elected_soak_refuses_start_empty() -> None:
    assert run(["bench", "soak", "--elected", "--restart-policy", "start-empty"]) == 2
    assert run(["bench", "soak", "--elected", "--leader-ttl", "1"]) == 2
