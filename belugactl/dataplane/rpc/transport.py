"""Client transports: the interface, and the registry that picks one by URL scheme.

A transport moves one request and its reply; it knows nothing about what the ops mean. Every
transport offers `call` (one round trip), `call_many` (a pipelined burst, replies in order) and
`submit`/`collect` (several requests in flight, for the benchmarks). Any failure to get a well-formed reply raises
`TransportError` and marks the transport broken; the client turns that into `MetadataUnavailable`.

Transports register themselves by scheme (`@register_transport`); `transport_for(url)` imports
every `rpc/transport_<scheme>.py` module and picks the class. Adding a transport: that module, plus
its server twin `mds/listener_<scheme>.py`; nothing else changes. Built in: `cxl://<pool>#<ring>`
(transport_cxl.py) and `tcp://<host>:<port>` (transport_tcp.py).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from belugactl.dataplane.scheme_registry import import_plugins, register_scheme
from belugactl.errors import UsageError

if TYPE_CHECKING:
    from belugactl.pool.mapping import PoolMapping

Reply = tuple[int, int, bytes]  # (code, server epoch low 32 bits, payload)
FENCED = -1  # call() code: the pool header's epoch moved since the client joined; nothing was sent


class TransportError(Exception):
    pass


class ClientTransport(ABC):
    """What KVIndexClient needs from a transport."""

    scheme: ClassVar[str]
    kind: ClassVar[str]
    example: ClassVar[str]  # an address, for error messages
    max_payload: int
    broken: bool
    # How many requests a batched caller may keep in flight (a pipelined burst): the ring's slots
    # for CXL; one (no pipelining) unless a transport says otherwise.
    max_inflight: int = 1
    pool: PoolMapping | None = None  # the pool mapping, when the transport lives in it

    @classmethod
    @abstractmethod
    def open(cls, address: str, *, pool: PoolMapping | None, timeout_s: float) -> ClientTransport:
        """Parse `address` (UsageError when malformed) and connect (TransportError when unreachable)."""

    @abstractmethod
    def default_client_id(self) -> int: ...

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def submit(self, op: int, epoch: int, payload: bytes) -> int: ...

    @abstractmethod
    def collect(self, timeout_ns: int) -> Reply: ...

    @abstractmethod
    def call(self, op: int, epoch: int, payload: bytes, timeout_ns: int) -> Reply: ...

    def call_many(self, op: int, epoch: int, payloads: Sequence[bytes], timeout_ns: int) -> list[Reply]:
        """Several requests as one pipelined burst (at most `max_inflight` in flight), the replies in
        order. Requests someone left in flight (a benchmark's raw submits) are drained first. A
        transport with a faster way (the CXL ring's native burst) overrides this."""
        while self.pending:
            self.collect(timeout_ns)
        window = max(1, self.max_inflight)
        replies: list[Reply] = []
        sent = 0
        while len(replies) < len(payloads):
            while sent < len(payloads) and sent - len(replies) < window:
                self.submit(op, epoch, payloads[sent])
                sent += 1
            replies.append(self.collect(timeout_ns))
        return replies

    def forget_epoch(self) -> None:
        """Before HELLO: stop checking for a fence (HELLO is how the new epoch is learnt)."""
        return None

    def adopt(self, epoch: int, max_payload: int) -> None:
        """After HELLO: the server's epoch and the largest payload it takes from this transport."""
        return None

    def current_epoch(self) -> int | None:
        """The epoch in force where the data lives (the pool header), if this transport can see it."""
        return None

    def close(self) -> None:
        return None

    @property
    @abstractmethod
    def pending(self) -> int: ...


TRANSPORTS: dict[str, type[ClientTransport]] = {}


def register_transport(cls: type[ClientTransport]) -> type[ClientTransport]:
    return register_scheme(TRANSPORTS, cls, "transports")


def load_transports() -> dict[str, type[ClientTransport]]:
    """Import every `transport_*` module of this package (each registers itself); return the registry."""
    import_plugins(__package__ or "belugactl.dataplane.rpc", "transport_")
    return TRANSPORTS


def transport_for(address: str) -> type[ClientTransport]:
    scheme = address.split("://", 1)[0] if "://" in address else ""
    registry = load_transports()
    cls = registry.get(scheme)
    if cls is None:
        known = " or ".join(c.example for c in registry.values())
        raise UsageError(f"unknown address scheme in {address!r}", fix=f"use {known}")
    return cls


def __getattr__(name: str) -> Any:
    # The classes moved to transport_cxl.py / transport_tcp.py; old imports keep working.
    if name in ("CxlTransport", "TcpTransport"):
        module = importlib.import_module(f"{__package__}.transport_{name[:3].lower()}")
        return getattr(module, name)
    raise AttributeError(name)
