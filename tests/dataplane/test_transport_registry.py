"""Transports are found by URL scheme on both sides; a new one plugs in without touching the client or server."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import ClassVar

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.listener import LISTENERS, Listener, load_listeners, register_listener
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc.transport import TRANSPORTS, ClientTransport, load_transports, register_transport
from belugactl.errors import UsageError
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc


def test_builtin_transports_are_registered_on_both_sides() -> None:
    assert {"cxl", "tcp"} <= set(load_transports()) and {"cxl", "tcp"} <= set(load_listeners())


@pytest.mark.parametrize("address", ["udp://127.0.0.1:1", "127.0.0.1:9471", "cxl://nopath", "tcp://host"])
def test_bad_addresses_are_usage_errors(address: str) -> None:
    with pytest.raises(UsageError):
        connect(address)


# --- a third transport, defined here: an in-process queue straight into the server's service ----------
_LOOP_SERVERS: dict[str, LoopListener] = {}


@register_listener
class LoopListener(Listener):
    scheme = "loop"

    @classmethod
    def from_url(cls, server: MetadataServer, url: str) -> Listener:
        listener = cls(server)
        _LOOP_SERVERS[url] = listener
        return listener

    def handle(self, op: int, epoch: int, payload: bytes) -> tuple[int, int, bytes]:
        # Called from the client's thread: tests only (the index is single-threaded by design).
        code, reply = self.server.service.handle(op, epoch, payload, 4096, owner=1 << 19)
        self.requests += 1
        return code, self.server.service.epoch32, reply

    def stats(self) -> dict:
        return {"requests": self.requests}


@register_transport
class LoopTransport(ClientTransport):
    scheme = "loop"
    kind = "loop"
    example: ClassVar[str] = "loop://<name>"

    def __init__(self, listener: LoopListener) -> None:
        self.listener = listener
        self.max_payload = 4096
        self.broken = False
        self._replies: deque = deque()

    @classmethod
    def open(cls, address: str, *, pool, timeout_s: float) -> LoopTransport:
        return cls(_LOOP_SERVERS[address])

    def default_client_id(self) -> int:
        return 7

    def reset(self) -> None:
        self._replies.clear()

    def submit(self, op: int, epoch: int, payload: bytes) -> int:
        self._replies.append(self.listener.handle(op, epoch, payload))
        return len(self._replies)

    def collect(self, timeout_ns: int):
        return self._replies.popleft()

    def call(self, op: int, epoch: int, payload: bytes, timeout_ns: int):
        return self.listener.handle(op, epoch, payload)

    @property
    def pending(self) -> int:
        return len(self._replies)


def test_a_new_transport_needs_no_change_to_client_or_server(pool_path: Path) -> None:
    try:
        pool = PoolMapping.open(pool_path)
        server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, listen=("loop://a",)))
        server.start()
        assert any(isinstance(lst, LoopListener) for lst in server.listeners)
        c = connect("loop://a")
        r = c.reserve("m", b"k" * 16, 4096)
        c.commit(r.token, zeros_crc(r.nbytes))
        loc = c.get("m", b"k" * 16)
        assert loc is not None and c.release([loc.lease_id]) == 1
        server.publish_snapshot()
        # HELLO, OPEN_NS, RESERVE, COMMIT, GET, RELEASE
        assert server.snapshot["listeners"]["loop"]["requests"] == 6
        server.close()
        pool.close()
    finally:
        TRANSPORTS.pop("loop", None)
        LISTENERS.pop("loop", None)
