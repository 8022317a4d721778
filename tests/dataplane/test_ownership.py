"""Tokens and leases belong to the ring or connection that got them; RELEASE's result reaches the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.dataplane.client import KVIndexClient, connect
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.metadata_errors import NotOwner, ReservationExpired
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

NS = "m/tp0"


@pytest.fixture
def running(pool_path: Path) -> Iterator[tuple[MetadataServer, PoolMapping]]:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=0, admin_port=None))
    server.start()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, pool
    server.stop()
    thread.join(10)
    pool.close()


def clients(server: MetadataServer, pool: PoolMapping) -> list[KVIndexClient]:
    return [
        connect(f"cxl://{pool.path}#1", pool=pool, timeout_s=5),
        connect(f"cxl://{pool.path}#2", pool=pool, timeout_s=5),
        connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5),
        connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5),
    ]


PAIRS = {"cxl-cxl": (0, 1), "cxl-cxl2": (1, 0), "tcp-tcp": (2, 3), "cxl-tcp": (0, 2), "tcp-cxl": (3, 1)}


@pytest.mark.parametrize("pair", list(PAIRS.values()), ids=list(PAIRS))
def test_only_the_owner_commits_aborts_and_releases(running, pair) -> None:
    server, pool = running
    cs = clients(server, pool)
    owner, other = cs[pair[0]], cs[pair[1]]
    r = owner.reserve(NS, b"k" * 32, 4096)
    with pytest.raises(NotOwner):
        other.commit(r.token, zeros_crc(r.nbytes))
    with pytest.raises(NotOwner):
        other.abort(r.token)
    assert other.get(NS, b"k" * 32) is None  # nothing became visible
    owner.commit(r.token, zeros_crc(r.nbytes))
    loc = other.get(NS, b"k" * 32)
    assert loc is not None and loc.lease_id
    with pytest.raises(NotOwner):
        owner.release([loc.lease_id])
    assert other.release([loc.lease_id]) == 1
    assert other.release([loc.lease_id]) == 0  # already ended: the caller learns it
    assert server.index.counters.foreign_refused == 3
    for c in cs:
        c.close()


@pytest.mark.parametrize("worker_kind", ["cxl", "tcp"])
def test_leases_granted_elsewhere_are_released_by_the_receiver_of_the_same_group(running, worker_kind) -> None:
    server, pool = running
    group = 0x5EC7E7
    scheduler = connect(f"cxl://{pool.path}#1", pool=pool, timeout_s=5, handover_group=group)
    address = f"cxl://{pool.path}#2" if worker_kind == "cxl" else f"tcp://127.0.0.1:{server.tcp_port}"
    worker = connect(address, pool=pool, timeout_s=5, handover_group=group)
    stranger = connect(f"tcp://127.0.0.1:{server.tcp_port}", timeout_s=5)  # knows the id, not the group
    other_group = connect(f"cxl://{pool.path}#3", pool=pool, timeout_s=5, handover_group=group + 1)
    r = worker.reserve(NS, b"h" * 32, 4096)
    worker.commit(r.token, zeros_crc(r.nbytes))
    loc = scheduler.get(NS, b"h" * 32)
    mine = worker.get(NS, b"h" * 32)
    assert loc is not None and mine is not None
    for c in (stranger, other_group):
        with pytest.raises(NotOwner):
            c.release([loc.lease_id], granted_elsewhere=True)
    assert server.index.counters.foreign_refused == 2 and server.service.released_granted_elsewhere == 0
    # One of the group's own and one passed on, in one request: both end.
    assert worker.release([mine.lease_id, loc.lease_id], granted_elsewhere=True) == 2
    assert server.service.released_granted_elsewhere == 1 and server.index.counters.foreign_refused == 2
    for c in (scheduler, worker, stranger, other_group):
        c.close()


def test_tokens_are_random_and_a_guess_commits_nothing(running) -> None:
    server, pool = running
    c = clients(server, pool)[0]
    tokens = [c.reserve(NS, bytes([i]) * 32, 4096).token for i in range(8)]
    assert len(set(tokens)) == 8 and all(abs(a - b) > 1 << 16 for a, b in zip(tokens, tokens[1:], strict=False))
    for guess in (tokens[0] + 1, tokens[-1] + 1, 1, 2):
        with pytest.raises(ReservationExpired):
            c.commit(guess, zeros_crc(4096))
    for t in tokens:
        c.abort(t)


def test_handover_groups_unit() -> None:
    """HandoverGroups alone: membership by HELLO, the check per lease owner, leaving, the cap."""
    from belugactl.dataplane.mds.ownership import HandoverGroups, LeaseCodec

    codec, groups = LeaseCodec(), HandoverGroups()
    ids = lambda *pairs: b"".join(codec.encode(s, o).to_bytes(8, "little") for s, o in pairs)  # noqa: E731
    groups.join(1, 77)  # scheduler
    groups.join(2, 77)  # worker
    groups.join(3, 78)  # another engine's worker
    assert groups.granted_within(codec, ids((5, 1), (6, 1)), 2, 2)
    assert groups.granted_within(codec, ids((5, 1), (6, 2)), 2, 1)  # its own and its scheduler's
    assert not groups.granted_within(codec, ids((5, 1), (6, 3)), 2, 2)  # one of another engine's
    assert not groups.granted_within(codec, ids((5, 1)), 3, 1)
    assert not groups.granted_within(codec, ids((5, 1)), 9, 1)  # said no group
    groups.join(2, 0)  # a new HELLO without a group: no longer a member
    assert not groups.granted_within(codec, ids((5, 1)), 2, 1)
    groups.forget(1)
    groups.join(2, 77)
    assert not groups.granted_within(codec, ids((5, 1)), 2, 1)  # the granter left
    for owner in range(100, 100 + HandoverGroups.MAX_MEMBERS):
        groups.join(owner, 5)
    groups.join(99, 5)
    assert groups.refused_joins == 1 and 99 not in groups.group_of
