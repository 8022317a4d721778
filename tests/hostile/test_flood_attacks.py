"""One connection cannot take the server from others: repeated keys, reservation floods, namespace
churn and ping-only connections each meet a per-owner cap (mds/quotas.py) or give way."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from belugactl.dataplane.client import Reservation, connect
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping
from tests.hostile.bursts import big_fixture, fill  # noqa: F401 - a fixture
from tests.hostile.conftest import NS, until, well_behaved_round_trip
from tests.support.blocks import zeros_crc
from tests.support.mds_process import Mds

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(120)]
KEY = b"k%08d" % 0 + b"." * 23


def _raw(client, op: int, payload: bytes) -> tuple[int, bytes]:
    code, _epoch, reply = client.transport.call(op, client._epoch32, payload, int(5e9))
    return code, reply


def test_get_many_naming_one_key_many_times_holds_one_lease(mds: Mds) -> None:
    c = connect(mds.tcp, timeout_s=5)
    fill(c, NS, 1, commit=True)
    before = c.stats()["leases"]
    # Before: a lease per repeat, uncapped (2.5 M live leases in 12 s from one connection).
    code, reply = _raw(c, Op.GET_MANY, p.encode_lookup(c._ns_id(NS), [KEY] * 1000))
    assert code == 0 and int.from_bytes(reply[:2], "little") > 1
    assert c.stats()["leases"] == before + 1
    c.close()


def test_a_reservation_flood_cannot_take_the_area_or_evict_others(big: Mds) -> None:
    honest = connect(big.tcp, timeout_s=10)
    fill(honest, NS, 1, commit=True)
    flood = connect(big.tcp, timeout_s=10)
    keys = [b"f%07d" % i + b"." * 24 for i in range(512)]  # 1 GiB in 2 MiB blocks: the whole area
    got = flood.reserve_many(NS, [(k, 2 << 20) for k in keys])
    held = sum(isinstance(r, Reservation) for r in got)
    # The per-owner cap (a quarter of the area) refuses the rest before anything is evicted.
    assert 0 < held <= 129 and Code.POOL_FULL in got
    assert honest.get(NS, KEY) is not None  # the honest block was not evicted for the flood
    r = honest.reserve(NS, b"mine".ljust(32, b"."), 8 << 20)
    honest.commit(r.token, zeros_crc(8 << 20))
    assert until(lambda: big.stats()["index"]["quotas"]["refused"]["reserved_bytes"] > 0, 5)
    assert big.stats()["index"]["evictions"] == 0
    flood.close()
    honest.close()


def test_namespace_churn_leaves_room_for_others(mds: Mds) -> None:
    c = connect(mds.tcp, timeout_s=5)
    # 4,096 distinct namespaces from one connection (the whole table, before).
    out = [_raw(c, Op.OPEN_NS, p.encode_name(f"churn/{i}"))[0] for i in range(4096)]
    assert out.count(int(Code.NS_LIMIT)) > 0 and out.count(0) <= 4096 // 8
    other = connect(mds.tcp, timeout_s=5)
    assert other.clear_namespace("mine/0") == 0  # opens a new namespace: no NS_LIMIT
    assert until(lambda: mds.stats()["index"]["quotas"]["refused"]["namespaces"] > 0, 5)
    c.close()
    other.close()


def test_ping_only_connections_give_way_at_the_cap(mds: Mds) -> None:
    pool = PoolMapping.open(mds.pool_path)
    stop = threading.Event()
    pingers = [connect(mds.tcp, timeout_s=2) for _ in range(32)]  # the cap (conftest's LIMITS)

    def ping() -> None:
        while not stop.is_set():
            for c in pingers:
                with contextlib.suppress(Exception):  # an evicted pinger: what is expected
                    c.ping(b"p")
            time.sleep(0.1)

    t = threading.Thread(target=ping, daemon=True)
    t.start()
    try:
        time.sleep(1.3)  # past evict_idle_after_s: pings are not work
        # Before: every new client was refused while the pingers held every place.
        well_behaved_round_trip(mds.tcp, pool, b"gets in".ljust(32, b"."))
        assert until(lambda: mds.stats()["tcp"]["evicted_idle"] >= 1, 5)
    finally:
        stop.set()
        t.join(5)
        for c in pingers:
            with contextlib.suppress(Exception):  # closing an evicted connection
                c.close()
        pool.close()
