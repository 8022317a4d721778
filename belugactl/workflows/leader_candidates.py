"""The TCP address a client dials when the rack's metadata server is elected through etcd (issue 32).

With `serve.metadata.etcd.candidates` in the manifest, only the elected leader binds the RPC port
(a standby answers nothing), and after a failover the leader is another host. A TCP client is given
every candidate in one address, `tcp://<host a>:<rpc_port>,<host b>:<rpc_port>` (the transport
tries them in turn: rpc/transport_tcp.py, dataplane/client.py), so it finds the new leader without
a restart of vLLM. Each candidate is dialled as `rpc_dial` says for that host (reachability.py).
"""

from __future__ import annotations

from belugactl.errors import InputError
from belugactl.model.manifest_schema import Host, Manifest
from belugactl.workflows.serve.reachability import rpc_dial


def candidate_hosts(manifest: Manifest) -> list[Host]:
    """The hosts of serve.metadata.etcd.candidates, in order ([] without etcd or candidates);
    InputError (exit 2) for a name that is not one of the manifest's hosts."""
    serve = manifest.serve
    conf = serve.metadata.etcd if serve is not None else None
    if conf is None or not conf.candidates:
        return []
    hosts = []
    for name in conf.candidates:
        try:
            hosts.append(manifest.host(name))
        except KeyError:
            raise InputError(
                f"serve.metadata.etcd.candidates names {name!r}, which is not a host of the manifest",
                fix=f"name hosts of hosts[] ({', '.join(manifest.host_names())})",
            ) from None
    return hosts


def candidates_address(manifest: Manifest, client: Host) -> str | None:
    """`tcp://a:9471,b:9471` for TCP clients on `client` when the manifest names candidates, else None
    (one server: the caller keeps its single address). InputError when a candidate cannot be dialled
    from `client` (an RPC bind on loopback, a host named twice)."""
    hosts = candidate_hosts(manifest)
    if not hosts:
        return None
    assert manifest.serve is not None
    meta = manifest.serve.metadata
    items: list[str] = []
    for host in hosts:
        dial = rpc_dial(meta, host, client)
        if dial.address is None:
            raise InputError(f"metadata candidate {host.name}: {dial.problem}")
        item = dial.address[len("tcp://") :]
        if item in items:
            raise InputError(
                f"metadata candidates dial the same address {dial.address} from {client.name} (serve.metadata."
                f"rpc_bind {meta.rpc_bind} is one host's address)",
                fix="set serve.metadata.rpc_bind to 0.0.0.0, so each candidate is dialled at its own address",
            )
        items.append(item)
    return "tcp://" + ",".join(items)
