"""A hostile tenant against a real server process (loopback, bounded): it floods leases (GET_MANY
repeating one key, over TCP and over its CXL ring), reservations, stored blocks, namespaces and
connections, and probes another tenant's namespace by id. Each is refused or bounded by its
manifest quota while the honest tenant is served and keeps its bytes (issue 30 item 2)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataError, MetadataUnavailable
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, read_block, start_mds, until, write_block
from tests.support.blocks import zeros_crc
from tests.support.small_rack import SMALL_RACK

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(180)]

LEASES, RESERVED, STORED, CONNECTIONS, NAMESPACES = 64, 2 << 20, 4 << 20, 3, 4
TENANTS = f"""\
tenants:
  - name: honest
    instances: [h0]
  - name: hostile
    instances: [h1]
    quotas: {{live_leases: {LEASES}, reserved_bytes: {RESERVED}, stored_bytes: {STORED},
              connections: {CONNECTIONS}, namespaces: {NAMESPACES}}}
"""
HONEST_RING, HOSTILE_RING = 0, 4  # h0's vllm-0 scheduler, h1's vllm-0 scheduler (tests/support/small_rack.py)
BLOCK = 64 << 10


@pytest.fixture
def manifest_path(tmp_path: Path) -> Path:
    path = tmp_path / "rack.yaml"
    path.write_text(SMALL_RACK + TENANTS)
    return path


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "code", None)


def _raw(client, op: int, payload: bytes) -> int:
    """The result code of one raw request (0: OK)."""
    try:
        client._call(op, payload)
    except MetadataError as exc:
        return int(_code(exc) or -1)
    return 0


def _tenant(mds, name: str) -> dict:
    return mds.stats()["index"]["tenants"][name]


def _put(c, pool, ns: str, key: bytes, n: int = BLOCK) -> None:
    r = c.reserve(ns, key, n)
    data = content(key, n)
    write_block(pool, r.extents, data)
    c.commit(r.token, native.crc32c(data))


def test_a_hostile_tenant_is_bounded_and_cannot_touch_the_honest_one(manifest_path: Path, pool_path: Path) -> None:
    with start_mds(manifest_path, pool_path, "--tcp-max-connections", "64") as mds:
        pool = PoolMapping.open(mds.pool_path)
        honest = connect(mds.cxl(HONEST_RING), pool=pool, timeout_s=5, tenant="honest")
        honest_keys = [b"honest-%d" % i for i in range(8)]
        for k in honest_keys:
            _put(honest, pool, NS, k.ljust(32, b"."))
        gone = b"honest-gone".ljust(32, b".")
        _put(honest, pool, NS, gone)
        assert honest.delete(NS, gone)  # a removal the hostile tenant must not be told of
        honest_ns = honest._ns[NS]
        bad = connect(mds.tcp, timeout_s=5, tenant="hostile")
        bad_ring = connect(mds.cxl(HOSTILE_RING), pool=pool, timeout_s=5, tenant="hostile")

        # 1. another tenant's namespace: the same name is a namespace of its own; its id answers nothing
        victim = honest_keys[0].ljust(32, b".")
        assert bad.get(NS, victim) is None
        assert bad._ns[NS] != honest_ns
        for op, payload in (
            (Op.LOOKUP_PREFIX, p.encode_lookup(honest_ns, [victim])),
            (Op.GET, p.encode_key(honest_ns, victim)),
            (Op.GET_MANY, p.encode_lookup(honest_ns, [victim])),
            (Op.DELETE, p.encode_key(honest_ns, victim)),
            (Op.CLEAR_NS, p.encode_u32(honest_ns)),
            (Op.RESERVE, p.encode_reserve(honest_ns, b"planted".ljust(32, b"."), BLOCK)),
            (Op.REMOVALS, p.encode_removals(0, honest_ns, 100)),
        ):
            assert _raw(bad, op, payload) == Code.UNKNOWN_NS, op.name
        assert bad.removals_since(0).items == []  # nothing of the honest tenant's is listed

        # 2. a lease flood: GET_MANY repeating one key, over TCP and over its ring (the native fast path)
        own = b"bait".ljust(32, b".")
        _put(bad, pool, NS, own, 4096)
        for _ in range(150):
            with contextlib.suppress(MetadataError):
                bad.get_many(NS, [own] * 5)
            with contextlib.suppress(MetadataError):
                bad_ring.get_many(NS, [own] * 5)
        assert until(lambda: _tenant(mds, "hostile")["refused"]["leases"] > 0, 5)
        assert _tenant(mds, "hostile")["live_leases"] <= LEASES
        assert mds.stats()["index"]["leases"] <= LEASES + 4  # the honest tenant holds none

        # 3. a reservation flood: bounded by its reserved bytes, refused with QUOTA, nothing evicted
        got = bad.reserve_many(NS, [(b"flood-%d" % i, BLOCK) for i in range(100)])
        reserved = [r for r in got if not isinstance(r, Code)]
        assert len(reserved) * BLOCK <= RESERVED + BLOCK and Code.QUOTA in got
        bad.abort_many([r.token for r in reserved])

        # 4. stored bytes: past its quota its own coldest blocks go, none of the honest tenant's
        for i in range(2 * STORED // BLOCK):
            r = bad.reserve(NS, b"store-%d" % i, BLOCK)
            bad.commit(r.token, zeros_crc(BLOCK))
        # (/stats is a snapshot the server refreshes each housekeeping tick: wait for the evictions)
        assert until(lambda: _tenant(mds, "hostile")["evictions"] > 0, 5)
        assert _tenant(mds, "hostile")["stored_bytes"] <= STORED and _tenant(mds, "honest")["evictions"] == 0

        # 5. namespace churn: at most its quota, then QUOTA; the honest tenant opens more
        opened = 1  # NS
        for i in range(3 * NAMESPACES):
            try:
                bad.get(f"churn-{i}", own)
                opened += 1
            except MetadataError as exc:
                assert _code(exc) == Code.QUOTA
        assert opened <= NAMESPACES

        # 6. connections: at most its quota (HELLO answers QUOTA to the rest)
        extra, refused = [], 0
        for _ in range(2 * CONNECTIONS):
            try:
                extra.append(connect(mds.tcp, timeout_s=5, tenant="hostile"))
            except MetadataUnavailable as exc:
                assert "refused HELLO: QUOTA" in str(exc)
                refused += 1
        assert len(extra) + 1 <= CONNECTIONS and refused
        # a tenant the manifest does not name, and a ring claiming another tenant, are refused
        for address, tenant in ((mds.tcp, "nobody"), (mds.cxl(HOSTILE_RING + 1), "honest")):
            with pytest.raises(MetadataUnavailable, match="NOT_OWNER"):
                connect(address, pool=pool, timeout_s=5, tenant=tenant)

        # the honest tenant is served throughout: its blocks are all there, byte for byte
        fresh = connect(mds.tcp, timeout_s=5, tenant="honest")
        assert fresh.get("fresh", own) is None  # a new namespace opens
        for k in honest_keys:
            key = k.ljust(32, b".")
            loc = honest.get(NS, key)
            assert loc is not None and read_block(pool, loc.extents) == content(key, BLOCK)
            honest.release([loc.lease_id])
        _put(honest, pool, NS, b"after".ljust(32, b"."))
        metrics = mds.admin("/metrics").decode()
        assert 'beluga_mds_tenant_stored_bytes{tenant="hostile"}' in metrics
        assert 'beluga_mds_tenant_refused_total{quota="leases",tenant="hostile"}' in metrics
        for c in (honest, bad, bad_ring, fresh, *extra):
            c.close()
        pool.close()
        assert mds.proc.poll() is None


def test_an_old_clients_hello_is_the_implicit_tenants(manifest_path: Path, pool_path: Path) -> None:
    """A HELLO without a tenant (an old client) still connects, as the implicit tenant, whose
    namespaces no named tenant sees."""
    with start_mds(manifest_path, pool_path) as mds:
        old = connect(mds.tcp, timeout_s=5)
        assert old.get(NS, b"k".ljust(32, b".")) is None
        named = connect(mds.tcp, timeout_s=5, tenant="honest")
        assert named.get(NS, b"k".ljust(32, b".")) is None
        assert named._ns[NS] != old._ns[NS]
        for c in (old, named):
            c.close()
