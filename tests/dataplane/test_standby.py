"""`metadata-server --standby` without a process: its flags, the election's lock on the pool, the metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.dataplane.mds.standby import elected_server_lock, leadership_metrics
from belugactl.errors import EnvironmentProblem
from belugactl.pool.lock import ServerLock

CPU_DEMO = Path(__file__).resolve().parents[2] / "examples" / "cpu-demo.yaml"


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
