"""A reconnecting flood of silent sockets at the TCP cap (issue 30 item 4), on a real server: the
flood's sockets displace one another (oldest first), a newcomer that says HELLO at once gets in every
time, and tenants that work keep their places, even when they hold every place but one (the flood
and the newcomers then share that one)."""

from __future__ import annotations

import threading
import time

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataError
from tests.hostile.conftest import NS
from tests.support.mds_process import Mds
from tests.support.silent_flood import reconnecting_flood

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(120)]

CAP = 32  # conftest's LIMITS


def test_working_tenants_keep_their_places_and_newcomers_get_the_last_one(mds: Mds) -> None:
    tenants = [connect(mds.tcp, timeout_s=5) for _ in range(CAP - 1)]
    for i, c in enumerate(tenants):
        assert c.get(NS, i.to_bytes(32, "big")) is None  # work: a lookup (a miss)
    stop = threading.Event()
    opened = [0]
    flood = threading.Thread(target=reconnecting_flood, args=(mds.port, 2 * CAP, stop, opened), daemon=True)
    flood.start()
    locked_out = 0
    try:
        time.sleep(0.5)
        for round_ in range(12):
            for i, c in enumerate(tenants):  # each tenant keeps working, on the same connection
                assert c.get(NS, (round_ * CAP + i).to_bytes(32, "big")) is None
            try:
                with connect(mds.tcp, timeout_s=2) as newcomer:
                    assert newcomer.ping(b"newcomer") == b"newcomer"
            except MetadataError:
                locked_out += 1
            time.sleep(0.2)
        tcp = mds.stats()["tcp"]
    finally:
        stop.set()
        flood.join(10)
    assert opened[0] > 2 * CAP  # the flood was displaced and reconnected
    assert tcp["displaced_unsettled"] > 0 and tcp["connections"] <= CAP
    assert locked_out == 0, f"a newcomer was locked out {locked_out} of 12 times: {tcp}"
    for c in tenants:  # none was displaced: each still answers on its own connection
        assert c.ping(b"still here") == b"still here"
        c.close()
