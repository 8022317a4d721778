"""`term_metrics` (mds/admin_metrics.py) from recorded /stats leadership snapshots of a leader and a
standby, as Prometheus text beside mds/standby.py's `beluga_mds_leader*`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from belugactl.dataplane.mds.admin_metrics import term_metrics
from belugactl.dataplane.mds.standby import leadership_metrics

# /stats "leadership" as Elector.stats() wrote it (tests/dataplane/test_standby_process.py's members).
LEADER = {"member": "mds-b", "key": "/belugactl/cpu-demo/metadata/leader", "leading": True, "leader": "mds-b",
          "leader_since": 1764943200.25, "leader_revision": 9, "leader_changes": 1, "terms_won": 2, "ttl_s": 2,
          "margin_s": 0.5, "deadline_in_s": 1.2, "last_lost": None}  # fmt: skip
STANDBY = {**LEADER, "member": "mds-a", "leading": False, "terms_won": 1, "deadline_in_s": None,
           "last_lost": "lease lapsed"}  # fmt: skip


def _text(snap: dict) -> str:
    class Collector:
        def collect(self):
            yield from leadership_metrics(snap.get("leadership"))
            yield from term_metrics(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_the_leader_says_when_its_term_began_and_how_many_it_won() -> None:
    text = _text({"epoch": 8, "leadership": LEADER})
    assert "beluga_mds_leader_term_start_seconds 1.76494320025e+09" in text
    assert "beluga_mds_leader_terms_won_total 2.0" in text
    assert 'beluga_mds_leader{member="mds-b"} 1.0' in text
    assert 'beluga_mds_leader_since_seconds{leader="mds-b"} 1.76494320025e+09' in text
    assert "beluga_mds_leader_changes_total 1.0" in text


def test_a_standby_has_no_term_of_its_own_and_a_plain_server_no_metrics() -> None:
    text = _text({"epoch": 0, "leadership": STANDBY})
    assert "beluga_mds_leader_term_start_seconds 0.0" in text
    assert "beluga_mds_leader_terms_won_total 1.0" in text
    assert 'beluga_mds_leader{member="mds-a"} 0.0' in text
    # a member that says it leads while the key names another (a term ending) has no term start either
    assert "beluga_mds_leader_term_start_seconds 0.0" in _text({"leadership": {**LEADER, "leader": "mds-c"}})
    assert list(term_metrics({"leadership": None})) == [] and list(term_metrics({})) == []
