"""What `belugactl rack` runs on each host: facts for the version-skew check, and the pool probe."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from belugactl import __version__
from belugactl.workflows.rack.probe import PROBE_SIZE, ProbeRecord, judge, probe_offsets

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext


def host_info(rack: RackContext) -> dict[str, Any]:
    """Facts for the version-skew check: belugactl's version, the manifest's digest and layout hash."""
    return {
        "hostname": socket.gethostname(),
        "host": rack.wanted_host,
        "belugactl_version": __version__,
        "manifest_path": rack.file,
        "manifest_sha256": rack.source_sha256(),
        "layout_hash": rack.layout.layout_hash,
    }


def probe_write(rack: RackContext, nonce: int) -> dict[str, Any]:
    from belugactl.pool.mapping import PoolMapping

    name = rack.host_name
    path = rack.pool_path()
    with PoolMapping.open(path, rack.manifest, layout=rack.layout) as mapping:
        offsets = probe_offsets(mapping.layout)
        index = rack.manifest.host_names().index(name)
        mapping.write(offsets[name], ProbeRecord.new(index, name, nonce).pack())
    return {"host": name, "pool": path, "offset": offsets[name], "nonce": nonce}


def probe_read(rack: RackContext, nonce: int) -> dict[str, Any]:
    from belugactl.pool.mapping import PoolMapping

    name = rack.host_name
    path = rack.pool_path()
    seen: dict[str, dict[str, Any]] = {}
    with PoolMapping.open(path, rack.manifest, writable=False, layout=rack.layout) as mapping:
        offsets = probe_offsets(mapping.layout)
        for index, entry in enumerate(rack.manifest.hosts):
            raw = mapping.read(offsets[entry.name], PROBE_SIZE)
            status, detail = judge(raw, host_index=index, host=entry.name, nonce=nonce)
            seen[entry.name] = {"status": status, "detail": detail, "offset": offsets[entry.name]}
    return {"host": name, "pool": path, "seen": seen}
