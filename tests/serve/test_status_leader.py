"""`belugactl status` names the metadata leader when the server is elected (metadata-server --standby)."""

from __future__ import annotations

from belugactl.workflows.serve.control import pool_summary


def test_pool_summary_carries_the_leader_of_an_elected_server() -> None:
    stats = {
        "epoch": 7,
        "ready": True,
        "index": {"entries": 3, "bytes_used": 10, "bytes_capacity": 100},
        "leadership": {"leader": "mds-b", "leader_since": 1764900000.0, "leader_changes": 2},
    }
    s = pool_summary(stats)
    assert s is not None
    assert (s["leader"], s["leader_since"], s["leader_changes"]) == ("mds-b", 1764900000.0, 2)


def test_a_plain_server_has_no_leader() -> None:
    s = pool_summary({"epoch": 1, "index": {}, "leadership": None})
    assert s is not None and s["leader"] is None and s["leader_changes"] is None
