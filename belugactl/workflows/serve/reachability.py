"""Where an instance dials the metadata server's TCP listener, and whether it can get there at all.

The listener binds `serve.metadata.rpc_bind`. An address in the plan that the listener does not
accept connections on disables the cache silently (the connector is best-effort: it misses and
skips saves), so the plan derives every dial address from the bind address:

- a loopback bind (127.0.0.1, ::1) answers only on the metadata host: instances there dial it;
  instances on any other host cannot reach it, which is a blocker;
- a wildcard bind (0.0.0.0, ::) answers everywhere: the metadata host dials loopback, other hosts
  dial the metadata host's address;
- a specific address answers only there, on the metadata host too: everyone dials that address,
  never 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Host, Manifest, MetadataServe


@dataclass(frozen=True)
class Dial:
    """The RPC address an instance on `client` is given, or why no address would work."""

    address: str | None  # tcp://host:port
    problem: str | None = None


def tcp_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def rpc_dial(meta: MetadataServe, server: Host, client: Host) -> Dial:
    """The address instances on `client` use for the metadata server on `server`."""
    bind = ipaddress.ip_address(meta.rpc_bind)
    port = meta.rpc_port
    same_host = server.name == client.name
    if bind.is_unspecified:
        loopback = "::1" if bind.version == 6 else "127.0.0.1"
        return Dial(tcp_url(loopback if same_host else server.address, port))
    if bind.is_loopback:
        if same_host:
            return Dial(tcp_url(str(bind), port))
        return Dial(
            None,
            f"instances on {client.name} would dial the metadata server at {server.address}:{port}, but "
            f"serve.metadata.rpc_bind is {meta.rpc_bind} (loopback only on {server.name}), so they could never "
            f"save or load a block; fix: set serve.metadata.rpc_bind to {server.address} (or 0.0.0.0) in the manifest",
        )
    return Dial(tcp_url(str(bind), port))


def unreachable_instances(meta: MetadataServe, server: Host, client: Host, instances: int) -> str | None:
    """A blocker naming every instance on `client` that could not reach the server, or None."""
    if instances <= 0:
        return None
    dial = rpc_dial(meta, server, client)
    if dial.problem is None:
        return None
    names = ", ".join(f"vllm-{i}" for i in range(instances))
    return f"{client.name} {names}: {dial.problem}"


def unreachable_elsewhere(manifest: Manifest, meta: MetadataServe, server: Host) -> list[str]:
    """Notes for the metadata host: other hosts whose instances could not reach this server."""
    notes = []
    for other in manifest.hosts:
        if other.name != server.name and manifest.instances_on(other):
            problem = rpc_dial(meta, server, other).problem
            if problem is not None:
                notes.append(f"{other.name}'s vLLM instances cannot reach this metadata server: {problem}")
    return notes
