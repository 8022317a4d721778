"""The election's rules (dataplane/mds/leadership.py) on a fake etcd and a fake clock."""

from __future__ import annotations

import threading

import pytest

from belugactl.dataplane.mds.leadership import Elector, leader_key, parse_endpoints
from tests.support.fake_etcd import Clock, FakeEtcd


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def etcd(clock: Clock) -> FakeEtcd:
    return FakeEtcd(clock)


def member(etcd: FakeEtcd, clock: Clock, name: str, **kw: float) -> Elector:
    return Elector(etcd, name, leader_key("r1"), clock=clock, wall=lambda: 1.7e9, **kw)


def test_one_winner_and_the_standby_sees_it(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    assert not b.campaign()
    assert b.last_leader is not None and b.last_leader.member == "mds-a"
    assert len(etcd.leases) == 1  # the loser gave its lease back
    assert a.holds() and not b.holds()
    # deadline = grant sent + TTL - margin (5 s, 1 s)
    assert a.deadline == pytest.approx(1004.0)


def test_keepalive_moves_the_deadline_from_when_it_was_sent(etcd: FakeEtcd, clock: Clock) -> None:
    a = member(etcd, clock, "mds-a")
    assert a.campaign()
    clock.t += 2.0
    assert a.keep_once()
    assert a.deadline == pytest.approx(1006.0)


def test_etcd_lost_the_leader_stops_before_the_lease_can_lapse(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    etcd.down = True
    clock.t += 1.6
    assert a.keep_once()  # unreachable, still before the deadline: keep serving
    clock.t += 2.4  # 1004.0: the deadline, one margin before the lease's expiry at 1005
    assert not a.holds()
    assert not a.keep_once()
    assert "deadline" in a.lost_reason
    etcd.down = False
    assert not b.campaign()  # the lease still lives on etcd: nobody else can win yet
    clock.t += 1.0  # the lease expires
    assert b.campaign()
    assert b.changes_seen == 1


def test_a_paused_leader_finds_its_term_over(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    clock.t += 6.0  # SIGSTOP: no keep-alive; the lease lapses and b wins
    assert b.campaign()
    # SIGCONT: the loop's check comes first, and a keep-alive never revives the term.
    assert not a.holds()
    assert not a.keep_once()
    assert etcd.keys[leader_key("r1")].lease == b.lease  # a's give-up touched nothing of b's


def test_a_late_keepalive_reply_does_not_revive_the_term(etcd: FakeEtcd, clock: Clock) -> None:
    a = member(etcd, clock, "mds-a")
    assert a.campaign()
    real = etcd.keepalive

    def slow(lease: int) -> int:
        out = real(lease)
        clock.t += 4.5  # the reply arrives past the deadline
        return out

    etcd.keepalive = slow  # type: ignore[method-assign]
    clock.t += 1.0
    assert not a.keep_once()
    assert not a.holds()
    assert "after the deadline" in a.lost_reason


def test_key_taken_from_under_the_leader(etcd: FakeEtcd, clock: Clock) -> None:
    a = member(etcd, clock, "mds-a")
    assert a.campaign()
    del etcd.keys[leader_key("r1")]  # an operator deleted it
    assert not a.keep_once()
    assert not a.holds()


def test_resign_gives_the_key_up_at_once(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    a.resign()
    assert not a.holds()
    assert b.campaign()


def test_wait_for_vacancy(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    stop = threading.Event()
    polls = []

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            polls.append(timeout)
            if len(polls) == 3:
                a.resign()
            return False

    assert b.wait_for_vacancy(Stop())
    assert len(polls) == 3
    stop.set()
    assert not b.wait_for_vacancy(stop)


def test_stats_say_who_leads(etcd: FakeEtcd, clock: Clock) -> None:
    a, b = member(etcd, clock, "mds-a"), member(etcd, clock, "mds-b")
    assert a.campaign()
    b.observe()
    s = b.stats()
    assert s["leader"] == "mds-a" and not s["leading"] and s["deadline_in_s"] is None
    assert a.stats()["leading"] and a.stats()["deadline_in_s"] == pytest.approx(4.0)


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        Elector(FakeEtcd(Clock()), "m", "k", ttl_s=0)
    with pytest.raises(ValueError):
        Elector(FakeEtcd(Clock()), "m", "k", ttl_s=1, margin_s=1)


def test_parse_endpoints() -> None:
    assert parse_endpoints("127.0.0.1:2379, http://[::1]:2380") == ["http://127.0.0.1:2379", "http://[::1]:2380"]
    assert parse_endpoints(["https://etcd-a"]) == ["https://etcd-a:2379"]
    for bad in ("", "ftp://x:1", "http://h:1/v3", "http://h:99999"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
