"""The server side of a transport: a listener, found through a registry keyed by URL scheme.

A listener turns bytes from clients into `MetadataService.handle(op, epoch, payload, max_reply,
owner)` calls and sends the replies back; the server owns the loop, the index and the epoch.
Two kinds:
- a spinning listener (the CXL slot rings): `serve(spin_ns)` busy-polls for at most `spin_ns`
  and serves what it finds; the server loop calls it most of the time;
- a selector listener (TCP): registers its sockets with the server's selector
  (`server.selector`, callbacks as the key data) and is served when they are ready.

Adding a transport: one module `mds/listener_<scheme>.py` with a `Listener` subclass decorated
with `@register_listener`, and its client twin `rpc/transport_<scheme>.py` (see rpc/transport.py).
Both registries import every module of that name pattern, so nothing else changes. A listener of a
new scheme is started for each `ServerConfig.listen` URL of that scheme (`from_url`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from belugactl.dataplane.scheme_registry import import_plugins, register_scheme

if TYPE_CHECKING:
    from belugactl.dataplane.mds.server import MetadataServer

LISTENERS: dict[str, type[Listener]] = {}


def register_listener(cls: type[Listener]) -> type[Listener]:
    return register_scheme(LISTENERS, cls, "listeners")


def load_listeners() -> dict[str, type[Listener]]:
    """Import every `listener_*` module of this package (each registers itself); return the registry."""
    import_plugins(__package__ or "belugactl.dataplane.mds", "listener_")
    return LISTENERS


class Listener(ABC):
    scheme: ClassVar[str]
    spins: ClassVar[bool] = False  # True: the server loop calls serve(spin_ns)
    requests: int = 0

    def __init__(self, server: MetadataServer) -> None:
        self.server = server

    @classmethod
    def from_config(cls, server: MetadataServer) -> list[Listener]:
        """The listeners of this scheme the server's config asks for (default: one per `listen` URL)."""
        return [cls.from_url(server, url) for url in server.config.listen if url.split(":", 1)[0] == cls.scheme]

    @classmethod
    def from_url(cls, server: MetadataServer, url: str) -> Listener:
        raise ValueError(f"the {cls.scheme} listener takes no URL ({url!r})")

    def bind(self) -> None:
        """Acquire sockets/ports (before the epoch moves: a failure here changes nothing shared)."""
        return None

    def after_epoch(self) -> None:
        """Called once the new epoch is in the pool header (e.g. fence requests left from before)."""
        return None

    def serve(self, spin_ns: int) -> int:
        """Spinning listeners only: serve what arrives within `spin_ns`; return how many requests."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Has clients that would like the spinning listener to yield more often."""
        return False

    @property
    def backlog(self) -> bool:
        """Requests already read wait for another turn (a client over its per-turn budget)."""
        return False

    def serve_backlog(self) -> None:
        """Give one more turn to what waits (called between turns of the server loop)."""
        return None

    def housekeeping(self, now: float) -> None:
        """A few times a second, from the server loop."""
        return None

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None:
        return None
