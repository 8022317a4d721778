"""A registry of classes keyed by URL scheme, filled by importing a package's modules of one name prefix.

The client transports (rpc/transport.py) and the server listeners (mds/listener.py) are plugged in
the same way: each module `transport_<scheme>.py` / `listener_<scheme>.py` registers its class with a
decorator, and the first lookup imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Protocol, TypeVar


class Schemed(Protocol):
    scheme: str


S = TypeVar("S", bound=Schemed)


def register_scheme(registry: dict[str, S], cls: S, kind: str) -> S:
    """Add `cls` under its `scheme`; a second class for a scheme already taken is a programming error."""
    taken = registry.get(cls.scheme)
    if taken is not None and taken is not cls:
        raise ValueError(f"two {kind} for scheme {cls.scheme!r}: {taken} and {cls}")
    registry[cls.scheme] = cls
    return cls


def import_plugins(package_name: str, prefix: str) -> None:
    """Import every module of `package_name` whose name starts with `prefix` (each registers itself)."""
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith(prefix):
            importlib.import_module(f"{package.__name__}.{info.name}")
