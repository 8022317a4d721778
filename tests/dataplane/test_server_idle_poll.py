"""How the metadata server's loop waits when its rings are quiet: busy-poll, then a short warm period
of 0.1 ms looks, then the idle poll (only the idle poll when it never busy-polls); and waits under a
millisecond are not rounded up by epoll."""

from __future__ import annotations

import selectors
import socket
from pathlib import Path

import pytest

from belugactl.dataplane.mds import server as server_mod
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig, quiet_wait_s
from belugactl.pool.mapping import PoolMapping


def test_the_wait_follows_busy_then_warm_then_idle() -> None:
    cfg = ServerConfig(idle_after_s=0.05, warm_after_s=0.05, warm_poll_s=0.0001, idle_poll_s=0.0005)
    assert quiet_wait_s(cfg, 0.01, rings=True) == 0.0  # busy-polling
    assert quiet_wait_s(cfg, 0.06, rings=True) == 0.0001  # warm: the client's next burst is near
    assert quiet_wait_s(cfg, 0.2, rings=True) == 0.0005  # idle
    assert quiet_wait_s(cfg, 0.0, rings=False) == 0.0005  # no rings: TCP wakes the select anyway
    # spin_after_ms 0 (the CPU demo): no busy-poll and no warm looks either, only the idle poll,
    # right after a request as later (the warm looks slowed the forward pass beside them).
    cpu = ServerConfig(idle_after_s=0.0)
    assert cpu.warm_poll_s < cpu.idle_poll_s and cpu.warm_after_s > 0
    for quiet in (0.0, 0.001, 0.049, 0.051, 1.0):
        assert quiet_wait_s(cpu, quiet, rings=True) == cpu.idle_poll_s


class RecordingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None):  # noqa: ANN201
        self.timeouts.append(timeout)
        return super().select(timeout)


@pytest.mark.parametrize(
    ("wait", "tcp_clients", "selects"),
    [
        (0.0001, False, [0, 0]),
        (0.0005, False, [0, 0]),
        (0.002, False, [0.002]),
        (0, False, [0]),
        (0.0005, True, [0.0005]),  # TCP clients connected: epoll wakes on their requests at once
    ],
)
def test_waits_under_a_millisecond_are_a_zero_select_and_a_sleep(
    pool_path: Path, monkeypatch: pytest.MonkeyPatch, wait: float, tcp_clients: bool, selects: list[float]
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(server_mod.time, "sleep", slept.append)
    pool = PoolMapping.open(pool_path)
    srv = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, fence_grace_s=0))
    a, b = socket.socketpair()
    try:
        srv.start()
        sel = RecordingSelector()
        sel.register(a, selectors.EVENT_READ, lambda mask: None)
        srv.selector = sel
        srv.poll_selector(wait, tcp_clients)
        assert sel.timeouts == selects
        assert slept == ([wait] if 0 < wait < 0.001 and not tcp_clients else [])
        # A TCP request already waiting is served without the sleep.
        b.send(b"x")
        slept.clear()
        sel.timeouts.clear()
        srv.poll_selector(wait, tcp_clients)
        assert slept == [] and sel.timeouts[0] in (0, wait)
    finally:
        a.close()
        b.close()
        srv.close()
        pool.close()
