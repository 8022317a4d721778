"""The best-effort index's REMOVALS (BestEffortIndex.removals_since) against a real metadata server
(no vLLM needed): a head query first, then the namespace's removals from the cursor, a refused
cursor answered with a head query, a server that is away answered with None."""

from __future__ import annotations

from pathlib import Path

from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.stats import ConnectorStats

from belugactl.dataplane.client import connect
from tests.support.blocks import zeros_crc
from tests.support.mds_process import Mds

REPO = Path(__file__).resolve().parents[3]
NS = "best-effort@layout@tp0of1"


def test_head_query_then_follow_then_refused_cursor(server: Mds) -> None:
    stats = ConnectorStats(None, role="scheduler")
    index = BestEffortIndex(server.tcp, stats=stats, timeout_s=5)
    writer = connect(server.tcp, timeout_s=5)
    for key in (b"a" * 32, b"other" * 6 + b"..", b"b" * 32):
        namespace = NS if key != b"other" * 6 + b".." else "elsewhere"
        writer.commit(writer.reserve(namespace, key, 4096).token, zeros_crc(4096))
    writer.delete(NS, b"a" * 32)  # before the index follows: not news to it

    got, head_query = index.removals_since(NS, 0, 0)
    assert head_query and got.items == [] and got.head == 2 and got.epoch == writer.epoch
    writer.delete("elsewhere", b"other" * 6 + b"..")
    writer.delete(NS, b"b" * 32)
    got, head_query = index.removals_since(NS, got.head, got.epoch)
    assert not head_query and [(r.key, r.why) for r in got.items] == [(b"b" * 32, "deleted")]  # its namespace only
    assert got.caught_up and got.next_cursor == got.head == 4

    again, head_query = index.removals_since(NS, 99, got.epoch)  # a cursor this server never issued
    assert head_query and again.head == 4 and stats.get("removals_refused") == 1
    writer.close()
    index.close()


def test_a_server_that_is_away_answers_none() -> None:
    stats = ConnectorStats(None, role="scheduler")
    index = BestEffortIndex("tcp://127.0.0.1:9", stats=stats, timeout_s=0.2, retry_s=60)
    assert index.removals_since(NS, 0, 0) is None
    assert stats.get("server_unavailable") == 1
