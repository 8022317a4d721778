"""The standby/leader cycle (dataplane/mds/standby.py:ElectedRun) on a fake etcd, a fake clock and a
stand-in server: a term that ends steps down and stands by again; a stop resigns; a failed start
gives the lease back."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from belugactl.dataplane.mds.leadership import Elector, leader_key
from belugactl.dataplane.mds.standby import ElectedRun
from tests.support.fake_etcd import Clock, FakeEtcd

KEY = leader_key("r1")


class Pool:
    def close(self) -> None:
        pass


class Config:
    admin_port: int | None = None


class StandIn:
    """What ElectedRun asks of a MetadataServer: serves until stopped or its term is over."""

    def __init__(self) -> None:
        self.leadership: Any = None
        self.config = Config()
        self.pool = Pool()
        self.epoch = 0
        self.stepped_down = ""
        self._stop = threading.Event()
        self.started = False

    def start(self) -> None:
        self.started = True
        self.epoch = 1

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            if not self.leadership.holds():
                self.stepped_down = "the leader's deadline passed"
                return
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        pass


def wait_for(cond, what: str, timeout_s: float = 20.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"no {what}"
        time.sleep(0.005)


def test_a_lost_term_steps_down_stands_by_and_wins_again_then_a_stop_resigns() -> None:
    clock = Clock()
    etcd = FakeEtcd(clock)
    elector = Elector(etcd, "mds-a", KEY, clock=clock, wall=lambda: 1.7e9)
    events: list[str] = []
    run = ElectedRun(elector, StandIn, lambda name, info: events.append(name))
    t = threading.Thread(target=run.run, daemon=True)
    t.start()
    wait_for(lambda: events == ["started"], "first term")
    etcd.down = True  # keep-alives fail from here
    clock.t += 4.5  # past the deadline (grant + 5 s - 1 s) before the lease lapses on etcd (5 s)
    wait_for(lambda: events == ["started", "stepped-down"], "step-down")
    assert "deadline" in elector.lost_reason and not elector.holds()
    etcd.down = False
    time.sleep(0.3)  # a standby poll or two: the old lease still holds the key, nobody may win
    assert events == ["started", "stepped-down"]
    clock.t += 1.0  # the lease lapses on etcd
    wait_for(lambda: events == ["started", "stepped-down", "started"], "second term")
    assert run.terms == 2 and elector.terms_won == 2
    run.stop()
    t.join(timeout=10)
    assert not t.is_alive()
    assert KEY not in etcd.keys and not etcd.leases  # resigned: a standby need not wait out the TTL


def test_a_server_that_fails_to_start_gives_the_lease_back() -> None:
    clock = Clock()
    etcd = FakeEtcd(clock)
    elector = Elector(etcd, "mds-a", KEY, clock=clock, wall=lambda: 1.7e9)

    class Broken(StandIn):
        def start(self) -> None:
            raise OSError("pool missing")

    run = ElectedRun(elector, Broken, lambda name, info: None)
    with pytest.raises(OSError, match="pool missing"):
        run.run()
    assert KEY not in etcd.keys and not etcd.leases
