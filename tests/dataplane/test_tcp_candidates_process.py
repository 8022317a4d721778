"""A TCP client given both elected servers (`tcp://a,b`) follows the leader through a SIGKILL: two
`metadata-server --standby` processes on one file pool and a real etcd on loopback (issue 32)."""

from __future__ import annotations

import signal

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataUnavailable, StaleEpoch
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_standby_process import NS, commit_blocks, members, rack
from tests.support.etcd import _free_port

pytestmark = pytest.mark.process


def _served(client, pool: PoolMapping, keys: list[bytes]) -> int:  # noqa: ANN001 - a KVIndexClient
    n = client.lookup_prefix(NS, keys)
    for k in keys[:n]:
        loc = client.get(NS, k)
        assert loc is not None
        assert b"".join(pool.read(off, ln) for off, ln in loc.extents)[: 32 * 1000] == k * 1000
    return n


def test_a_tcp_client_given_both_servers_follows_the_leader_through_a_kill() -> None:
    pa, pb = _free_port(), _free_port()
    spec = (("mds-a", 2, "--rpc-port", str(pa)), ("mds-b", 2, "--rpc-port", str(pb)))
    with rack() as (etcd, pool_path, tmp), members(etcd, pool_path, tmp, *spec) as (a, b):
        keys = commit_blocks(pool_path, ring=1)
        pool = PoolMapping.open(pool_path)
        client = connect(f"tcp://127.0.0.1:{pb},127.0.0.1:{pa}", pool=pool, timeout_s=2, failover_s=60)
        try:
            assert client.transport.address == ("127.0.0.1", pa)  # mds-b, a standby, listens on nothing
            assert _served(client, pool, keys) == len(keys) and client.epoch == 1
            a.signal(signal.SIGKILL)
            # The next lookup finds mds-b once it leads (TTL 2 s, then its start-up), the same client
            # object: StaleEpoch once (leases of epoch 1 are void), joined to the new leader already.
            with pytest.raises(StaleEpoch):
                client.lookup_prefix(NS, keys)
            assert client.epoch == 2 and client.transport.address == ("127.0.0.1", pb)
            assert _served(client, pool, keys) == len(keys)  # the right bytes, from the new leader
            # Every candidate dead: a request gives up within the client's failover deadline.
            client.failover_s = 0.5
            b.signal(signal.SIGKILL)
            with pytest.raises(MetadataUnavailable, match="did not answer") as err:
                client.lookup_prefix(NS, keys)
            assert "none of the 2" in (err.value.why or "")
        finally:
            client.close()
            pool.close()
