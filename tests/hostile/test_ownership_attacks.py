"""Foreign and guessed COMMIT/ABORT/RELEASE: refused, counted, and the victim's bytes stay its own."""

from __future__ import annotations

import contextlib
import random

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import NotOwner, ReservationExpired
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import NS, content, read_block, well_behaved_round_trip, write_block
from tests.support.blocks import zeros_crc

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


@pytest.mark.parametrize("attacker_kind", ["cxl", "tcp"])
def test_foreign_commit_abort_release_are_refused(mds, attacker_kind: str) -> None:
    pool = PoolMapping.open(mds.pool_path)
    victim = connect(mds.cxl(1), pool=pool, timeout_s=5)
    attacker = connect(mds.cxl(2), pool=pool, timeout_s=5) if attacker_kind == "cxl" else connect(mds.tcp, timeout_s=5)
    n = 64 << 10
    key = b"victim".ljust(32, b".")
    r = victim.reserve(NS, key, n)
    write_block(pool, r.extents, content(key, n // 2))  # half written: a commit now would publish garbage
    with pytest.raises(NotOwner):
        attacker.commit(r.token, native.crc32c(content(key, n // 2)))
    with pytest.raises(NotOwner):
        attacker.abort(r.token)
    assert attacker.get(NS, key) is None
    write_block(pool, r.extents, content(key, n))
    victim.commit(r.token, native.crc32c(content(key, n)))
    reader = connect(mds.cxl(3), pool=pool, timeout_s=5)
    loc = reader.get(NS, key)
    assert loc is not None
    with pytest.raises(NotOwner):  # releasing the reader's lease would let the block be evicted under it
        attacker.release([loc.lease_id])
    assert read_block(pool, loc.extents) == content(key, n)
    assert reader.release([loc.lease_id]) == 1
    metrics = mds.admin("/metrics").decode()
    assert "beluga_mds_foreign_refused_total" in metrics
    assert _refused_soon(mds)  # the admin snapshot is refreshed every housekeeping tick
    well_behaved_round_trip(mds.cxl(4), pool, b"after".ljust(32, b"."))
    for c in (victim, attacker, reader):
        c.close()
    pool.close()


def _refused_soon(mds) -> bool:
    from tests.hostile.conftest import until

    return until(lambda: mds.stats()["requests"]["foreign_refused"] >= 3, 2)


def test_guessed_tokens_and_leases_hit_nothing(mds) -> None:
    pool = PoolMapping.open(mds.pool_path)
    victim = connect(mds.cxl(1), pool=pool, timeout_s=5)
    attacker = connect(mds.tcp, timeout_s=5)
    keys = [f"g{i}".encode().ljust(32, b".") for i in range(8)]
    tokens = [victim.reserve(NS, k, 4096).token for k in keys]
    mine = attacker.reserve(NS, b"attacker".ljust(32, b"."), 4096)
    rng = random.Random(7)
    guesses = {mine.token + d for d in range(-200, 201) if d} | {rng.getrandbits(64) for _ in range(600)}
    guesses |= set(range(1, 200))
    hits = 0
    for g in sorted(guesses)[:1000]:  # bounded
        try:
            attacker.commit(g, zeros_crc(4096))
            hits += 1
        except (ReservationExpired, NotOwner):
            pass
    assert hits == 0
    # leases: the attacker's own neighbours and random ids release nothing of the victim's
    for k, t in zip(keys, tokens, strict=True):
        assert attacker.get(NS, k) is None  # no guess committed it
        victim.commit(t, zeros_crc(4096))
    locs = [victim.get(NS, k) for k in keys]
    own = attacker.get(NS, keys[0])
    assert own is not None
    leases_before = victim.stats()["leases"]
    released = 0
    for g in [own.lease_id + d for d in range(-100, 101) if d] + [rng.getrandbits(64) for _ in range(300)]:
        with contextlib.suppress(NotOwner):
            released += attacker.release([g])
    assert released == 0 and victim.stats()["leases"] == leases_before
    assert attacker.release([own.lease_id]) == 1
    assert victim.release([loc.lease_id for loc in locs if loc]) == len(keys)
    victim.close()
    attacker.close()
    pool.close()
