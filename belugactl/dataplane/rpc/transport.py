"""Client transports: the interface, and the registry that picks one by URL scheme.

A transport moves one request and its reply; it knows nothing about what the ops mean. Every
transport offers `call` (one round trip), `call_many` (a pipelined burst, replies in order) and
`submit`/`collect` (several requests in flight, for the benchmarks). Any failure to get a well-formed reply raises
`TransportError` and marks the transport broken; the client turns that into `MetadataUnavailable`.
A transport that can do more in one native call (a GET_MANY burst, a lookup whose reply is taken
later, a release without waiting) says so in the `can_*` class attributes and overrides the
methods listed with them; the defaults say "not supported".

Transports register themselves by scheme (`@register_transport`); `transport_for(url)` imports
every `rpc/transport_<scheme>.py` module and picks the class. Adding a transport: that module, plus
its server twin `mds/listener_<scheme>.py`; nothing else changes. Built in: `cxl://<pool>#<ring>`
(transport_cxl.py) and `tcp://<host>:<port>` (transport_tcp.py).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from array import array
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

    # --- what a transport can do beyond one request at a time ---------------------------------
    # Declared per class, so the client checks a class attribute instead of probing for methods.
    # A transport that sets one to True overrides the methods listed with it; those methods may
    # still answer None ("not this time, nothing was sent": no native helper, no room in flight),
    # and the client then takes the plain path. The defaults below say "not supported".
    can_get_many_in_one_call: ClassVar[bool] = False  # get_many
    can_start_lookups: ClassVar[bool] = False  # start_get_many, finish_get_many
    can_release_in_one_call: ClassVar[bool] = False  # release_nowait, release_args, unreserve

    def get_many(
        self, epoch: int, ns: int, keys: Sequence[bytes], per_message: int, timeout_ns: int
    ) -> tuple[int, Any, Any] | tuple[int, Any] | None:
        """A GET_MANY lookup of `keys` (`per_message` to a message) encoded, sent as one burst and
        decoded in one call: (0, locations, indices of keys no reply carried), (code, message
        index) for a refused message, or (-3 / -4, why) for a reply that is not a GET_MANY answer.
        None: nothing was sent, the client uses `call_many`."""
        return None

    def start_get_many(self, epoch: int, ns: int, keys: Sequence[bytes], per_message: int) -> int | None:
        """Send `get_many`'s messages without waiting; their replies stay in flight for
        `finish_get_many`. Returns the first message's sequence number; None: nothing was sent."""
        return None

    def finish_get_many(
        self, seq: int, nkeys: int, per_message: int, timeout_ns: int
    ) -> tuple[int, Any, Any] | tuple[int, Any]:
        """The replies of the lookup `start_get_many` sent from `seq` (the oldest requests in
        flight), taken and decoded as `get_many` returns them."""
        raise NotImplementedError(f"{type(self).__name__} cannot start lookups")

    def release_nowait(
        self, epoch: int, lease_ids: Sequence[int] | array, flags: int, per_message: int
    ) -> list[int] | int | None:
        """RELEASE messages for `lease_ids`, `per_message` ids each, encoded and sent in one call
        without waiting: the ids in each message sent, or FENCED (nothing sent). None: nothing was
        sent, the client submits them itself."""
        return None

    def release_args(
        self, epoch: int, lease_ids: Sequence[int] | array, flags: int, per_message: int, messages: int = 0
    ) -> tuple[Any, ...] | None:
        """The arguments of the native no-wait release, for a caller whose own native call sends it
        (the one-call load); with `messages`, that many sequences are booked now (`unreserve`
        gives back the unsent ones). None: it cannot go that way."""
        return None

    def unreserve(self, seq: int, reserved: int, sent: int) -> None:
        """Give back the sequences `release_args` booked from `seq` that were not sent."""
        raise NotImplementedError(f"{type(self).__name__} cannot release in one call")

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
