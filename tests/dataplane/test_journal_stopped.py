"""Never silently empty: when journaling has to stop, /readyz fails with the reason, a metric says so,
the pool keeps a stop record (doctor's metadata.journal), and the next start says why it restored nothing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from belugactl.dataplane.mds.index import IndexConfig
from belugactl.dataplane.mds.journal import MAGIC, STOP_AT, read_stop
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc


def start(pool_path: Path, admin: bool = False) -> tuple[PoolMapping, MetadataServer]:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(
        pool,
        ServerConfig(
            rpc_port=None, admin_port=0 if admin else None, restart_policy="journal", index=IndexConfig()
        ),
    )
    server.start()
    return pool, server


def put(server: MetadataServer, ns: int, key: bytes, n: int = 4096) -> None:
    token, _ = server.index.reserve(ns, key, n)
    server.index.commit(token, checksum=zeros_crc(n))


def fill_until_stopped(server: MetadataServer) -> None:
    assert server.keeper is not None and server.keeper.journal is not None
    server.keeper.journal.half_size = 4096  # a journal too small for what is stored next
    ns = server.index.open_namespace("m/tp0")
    for i in range(100):
        put(server, ns, i.to_bytes(4, "little") * 8)
    assert len(server.index.entries) == 100  # serving went on: only the journal stopped


def metric(server: MetadataServer, name: str) -> float:
    from belugactl.dataplane.mds.admin import _Collector

    for family in _Collector(server).collect():
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_full_journal_fails_readyz_with_the_reason_and_says_so_in_a_metric(pool_path: Path) -> None:
    pool, server = start(pool_path, admin=True)
    assert server.admin_port is not None
    assert get(server.admin_port, "/readyz")[0] == 200
    assert metric(server, "beluga_mds_journal_stopped") == 0
    fill_until_stopped(server)
    server.publish_snapshot()
    status, body = get(server.admin_port, "/readyz")
    assert status == 503
    reason = json.loads(body)["reason"]
    assert reason.startswith("journal stopped:") and "will not survive a restart" in reason
    assert metric(server, "beluga_mds_journal_stopped") == 1
    assert metric(server, "beluga_mds_journal_active") == 0
    assert "beluga_mds_journal_stopped 1.0" in get(server.admin_port, "/metrics")[1]
    assert server.service.ready  # requests are still answered
    # On media: no journal any more, and the stop record says why.
    assert pool.read(server.geometry.journal_offset, 8) != MAGIC
    stop = read_stop(pool.read, server.geometry.journal_offset)
    assert stop is not None and stop.epoch == server.epoch and "journal" in stop.reason
    server.close()
    pool.close()


def test_the_next_start_says_why_it_restored_nothing_then_journals_again(pool_path: Path) -> None:
    pool, first = start(pool_path)
    fill_until_stopped(first)
    first.close()
    pool.close()

    pool, second = start(pool_path)
    assert second.restored_entries == 0
    assert second.keeper is not None and second.keeper.previous_stop is not None
    assert "previous server's journal stopped" in second.journal_note
    assert second.snapshot["journal"]["previous_stop"]["epoch"] == first.epoch
    assert metric(second, "beluga_mds_journal_lost_at_start") == 1
    assert second.readiness()[0]  # this incarnation journals: ready
    assert read_stop(pool.read, second.geometry.journal_offset) is None  # the record is cleared
    put(second, second.index.open_namespace("m/tp0"), b"k" * 32)
    second.close()
    pool.close()

    pool, third = start(pool_path)
    assert third.restored_entries == 1 and third.keeper is not None and third.keeper.previous_stop is None
    assert metric(third, "beluga_mds_journal_lost_at_start") == 0
    third.close()
    pool.close()


def test_a_journal_write_that_fails_stops_journaling_loudly(pool_path: Path, monkeypatch) -> None:
    pool, server = start(pool_path)
    journal = server.keeper.journal if server.keeper else None
    assert journal is not None
    real = pool.write
    area = range(server.geometry.journal_offset + 4096, server.geometry.journal_offset + server.geometry.journal_size)

    def failing(offset: int, data, **kw) -> None:  # noqa: ANN001
        if offset in area:
            raise OSError(5, "Input/output error")
        real(offset, data, **kw)

    monkeypatch.setattr(pool, "write", failing)
    put(server, server.index.open_namespace("m/tp0"), b"k" * 32)
    ready, reason = server.readiness()
    assert not ready and "journal write failed" in reason and "Input/output error" in reason
    monkeypatch.setattr(pool, "write", real)
    server.close()
    pool.close()


@pytest.mark.parametrize("policy", ["start-empty"])
def test_start_empty_has_no_journal_metric_raised(pool_path: Path, policy: str) -> None:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, restart_policy=policy))
    server.start()
    assert metric(server, "beluga_mds_journal_stopped") == 0 and server.readiness()[0]
    assert pool.read(server.geometry.journal_offset + STOP_AT, 8) == bytes(8)
    server.close()
    pool.close()
