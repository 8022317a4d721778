"""`metadata-server --standby` without a process: the election's lock on the pool, the metrics, and
an in-process server that loses its term (MetadataServer.fenced_out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.mds.standby import elected_server_lock, leadership_metrics
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.errors import EnvironmentProblem
from belugactl.pool.lock import ServerLock
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc
from tests.support.pool_bytes import fingerprint


def test_elected_servers_share_the_pool_and_a_plain_one_is_kept_out(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    pool.write_bytes(b"\0" * 4096)
    a, b = elected_server_lock(pool), elected_server_lock(pool)  # a paused leader and its standby, one host
    with pytest.raises(EnvironmentProblem):
        ServerLock.acquire(pool)
    a.release()
    b.release()
    plain = ServerLock.acquire(pool)
    with pytest.raises(EnvironmentProblem, match="not elected"):
        elected_server_lock(pool)
    plain.release()


def test_leadership_metrics() -> None:
    assert list(leadership_metrics(None)) == []
    stats = {"member": "mds-b", "leading": True, "leader": "mds-b", "leader_since": 1.7e9, "leader_changes": 2,
             "deadline_in_s": 3.5}  # fmt: skip
    by_name = {m.name: m for m in leadership_metrics(stats)}
    assert by_name["beluga_mds_leader"].samples[0].value == 1
    assert by_name["beluga_mds_leader"].samples[0].labels == {"member": "mds-b"}
    assert by_name["beluga_mds_leader_changes"].samples[0].value == 2
    assert by_name["beluga_mds_leader_since_seconds"].samples[0].labels == {"leader": "mds-b"}


class Term:
    """A leadership.Elector as the server sees it: `holds()` until the test ends the term."""

    def __init__(self) -> None:
        self.ok = True
        self.lost_reason = ""

    def holds(self) -> bool:
        return self.ok

    def stats(self) -> dict:
        return {"member": "t", "leading": self.ok}


def elected_server(pool: PoolMapping) -> tuple[MetadataServer, Term]:
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None))
    term = Term()
    server.leadership = term
    server.start()
    return server, term


def reserve_and_commit(server: MetadataServer) -> None:
    """One put from ring 3: the fence line now holds a deadline, and nothing is left open."""
    svc = server.service
    ns = p.decode_u32(svc.handle(Op.OPEN_NS, svc.epoch32, p.encode_name("m"), 200, 3)[1], "ns")
    code, _ = svc.handle(Op.RESERVE, svc.epoch32, p.encode_reserve(ns, b"k" * 8, 4096), 200, 3)
    assert code == Code.OK
    server.index.commit(next(iter(server.index.pending)), checksum=zeros_crc(4096))


def test_a_server_past_its_deadline_stops_and_writes_nothing(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server, term = elected_server(pool)
    assert server.snapshot["leadership"] == {"member": "t", "leading": True}
    reserve_and_commit(server)
    term.ok = False  # the deadline passed (etcd lost, or the process was paused past it)
    before = fingerprint(pool_path)
    server.housekeeping()  # would lower the fence line to 0 (nothing open) if it still led
    server.serve_forever()  # returns at once: stepped down before its first turn, then closes
    assert server.stepped_down == "the leader's deadline passed"
    assert fingerprint(pool_path) == before  # nor the fence line a clean stop writes
    pool.close()


def test_a_server_whose_epoch_was_bumped_by_another_steps_down(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server, _term = elected_server(pool)
    reserve_and_commit(server)
    pool.bump_epoch()  # a new leader took over
    before = fingerprint(pool_path)
    server.housekeeping()
    assert "epoch moved on" in server.stepped_down
    server.close()
    assert fingerprint(pool_path) == before
    pool.close()


def test_a_plain_server_is_untouched(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None))
    server.start()
    assert not server.fenced_out(epoch=True) and server.snapshot["leadership"] is None
    server.close()
    pool.close()
