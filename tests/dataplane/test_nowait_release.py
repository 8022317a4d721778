"""Leases trusted by time, and RELEASE sent without waiting for its reply (`release_nowait`, nowait.py).

A real metadata server process on the CPU demo's file pool, over its CXL-RPC ring and over TCP: the
server announces its lease TTL in HELLO; a no-wait RELEASE reaches the server at once, and its reply
(with the live count) is taken before the client's next request, which then works as usual."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from belugactl.dataplane.client import LEASE_TRUST_SHARE, KVIndexClient, connect
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Op
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc
from tests.support.mds_process import Mds, cpu_demo_mds

NS = "nowait"


@pytest.fixture(scope="module")
def mds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mds]:
    with cpu_demo_mds(tmp_path_factory.mktemp("nowait"), "--lease-ttl", "0.5", "--spin-after-ms", "0") as m:
        yield m


@pytest.fixture(params=["cxl", "tcp"])
def client(request: pytest.FixtureRequest, mds: Mds) -> Iterator[KVIndexClient]:
    if request.param == "cxl":
        pool = PoolMapping.open(mds.pool_path)
        c = connect(mds.cxl(3), pool=pool, timeout_s=5)
    else:
        c = connect(mds.tcp, timeout_s=5)
    yield c
    c.close()


def _leases_held(mds: Mds) -> int:
    with connect(mds.tcp, timeout_s=5) as onlooker:
        return onlooker.stats()["leases"]


def _wait_leases(mds: Mds, want: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (held := _leases_held(mds)) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return held


def _committed(c: KVIndexClient, keys: list[bytes]) -> None:
    for k in keys:
        try:
            c.commit(c.reserve(NS, k, 4096).token, zeros_crc(4096))
        except Exception as exc:  # noqa: BLE001 - present from an earlier test of this module
            assert type(exc).__name__ == "AlreadyPresent", exc


def test_hello_announces_the_lease_ttl_and_the_trust_window_is_a_share_of_it(client: KVIndexClient) -> None:
    assert client.lease_ttl_s == pytest.approx(0.5)
    assert client.lease_trusted_until(100.0) == pytest.approx(100.0 + LEASE_TRUST_SHARE * 0.5)


def test_a_nowait_release_ends_the_leases_without_a_wait_and_its_reply_is_taken_later(
    client: KVIndexClient, mds: Mds
) -> None:
    keys = [b"a" * 32, b"b" * 32, b"c" * 32]
    _committed(client, keys)
    _wait_leases(mds, 0)
    located = client.get_many_tuples(NS, keys)
    leases = [loc[1] for loc in located if loc]
    assert len(leases) == 3 and _leases_held(mds) == 3
    trips = client.round_trips
    assert client.release_nowait(leases) is True
    assert client.round_trips == trips  # nothing waited for
    assert client.replies_pending == 1
    assert _wait_leases(mds, 0) == 0  # the server ended them: the reply is waiting in the ring or socket
    assert client.replies_pending == 1
    # The next request takes that reply first and is answered as usual.
    assert [loc is not None for loc in client.get_many_tuples(NS, keys)] == [True, True, True]
    assert client.replies_pending == 0 and client.nowait_leases_ended == 0 and client.nowait_refused == 0
    client.collect_replies()  # nothing left: a no-op
    _wait_leases(mds, 0)


def test_a_nowait_release_of_an_expired_lease_is_counted_when_its_reply_is_taken(
    client: KVIndexClient, mds: Mds
) -> None:
    keys = [b"x" * 32]
    _committed(client, keys)
    (loc,) = client.get_many_tuples(NS, keys)
    assert loc is not None
    asked = time.monotonic()
    assert time.monotonic() < client.lease_trusted_until(asked)
    time.sleep(1.0)  # twice the server's TTL: the lease has ended
    assert time.monotonic() > client.lease_trusted_until(asked)  # a reader would not trust it by time now
    assert client.release_nowait([loc[1]]) is True
    client.collect_replies()
    assert client.replies_pending == 0 and client.nowait_leases_ended == 1


def test_a_release_longer_than_the_window_is_not_sent(client: KVIndexClient) -> None:
    t = client.transport
    per_msg = p.release_capacity(t.max_payload)
    too_many = list(range(1, per_msg * (t.max_inflight + 1) + 1))
    sent = client.messages
    assert client.release_nowait(too_many) is False
    assert client.messages == sent and client.replies_pending == 0 and t.pending == 0


def test_nothing_to_release_sends_nothing(client: KVIndexClient) -> None:
    sent = client.messages
    assert client.release_nowait([0, 0]) is True and client.release_nowait([]) is True
    assert client.messages == sent and client.replies_pending == 0


def test_a_refused_nowait_release_is_counted_and_the_client_goes_on(client: KVIndexClient, mds: Mds) -> None:
    # Another client's lease, not granted elsewhere and passed on: the server refuses it (NOT_OWNER).
    other = connect(mds.tcp, timeout_s=5)
    try:
        _committed(other, [b"o" * 32])
        (loc,) = other.get_many_tuples(NS, [b"o" * 32])
        assert loc is not None
        assert client.release_nowait([loc[1]]) is True
        client.collect_replies()
        assert client.nowait_refused == 1
        assert other.release([loc[1]]) == 1  # still its owner's to release
    finally:
        other.close()
    (mine,) = client.get_many_tuples(NS, [b"o" * 32])  # the client goes on
    assert mine is not None and client.release([mine[1]]) == 1


class _ShortReplies:
    """A fake transport whose RELEASE replies are malformed (too short), as a hostile server's."""

    can_release_in_one_call = False
    max_payload = 4096
    max_inflight = 4
    broken = False
    pool = None

    def __init__(self) -> None:
        self._inflight: list[int] = []

    def submit(self, op: int, epoch: int, payload: bytes) -> int:
        assert op == Op.RELEASE
        self._inflight.append(op)
        return len(self._inflight)

    def collect(self, timeout_ns: int) -> tuple[int, int, bytes]:
        self._inflight.pop(0)
        return 0, 0, b"\x01"

    @property
    def pending(self) -> int:
        return len(self._inflight)

    def current_epoch(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_malformed_nowait_reply_counts_as_refused_never_as_a_count() -> None:
    c = KVIndexClient(_ShortReplies(), address="fake://short-replies", client_id=1, timeout_s=1)  # type: ignore[arg-type]
    c.epoch = 1
    assert c.release_nowait([5, 6]) is True and c.replies_pending == 1
    c.collect_replies()
    assert c.replies_pending == 0 and c.nowait_refused == 1 and c.nowait_leases_ended == 0


def test_an_older_server_means_no_trust_by_time() -> None:
    c = KVIndexClient(_ShortReplies(), address="fake://short-replies", client_id=1, timeout_s=1)  # type: ignore[arg-type]
    assert c.lease_ttl_s == 0 and c.lease_trusted_until(time.monotonic()) is None
