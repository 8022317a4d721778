"""What `belugactl rack` runs on each host: facts for the version-skew check, and the pool probe."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

from belugactl import __version__
from belugactl.errors import EnvironmentProblem, UsageError
from belugactl.workflows.rack.probe import PROBE_SIZE, ProbeRecord, judge, probe_offsets


def host_info(manifest_path: str, host_name: str | None) -> dict[str, Any]:
    from belugactl.model.layout import resolve_layout
    from belugactl.model.manifest import load_manifest

    data = Path(manifest_path).read_bytes()
    manifest = load_manifest(manifest_path)
    layout = resolve_layout(manifest)
    return {
        "hostname": socket.gethostname(),
        "host": host_name,
        "belugactl_version": __version__,
        "manifest_path": str(manifest_path),
        "manifest_sha256": hashlib.sha256(data).hexdigest(),
        "layout_hash": layout.layout_hash,
    }


def _host_name(manifest: Any, host_name: str | None) -> str:
    from belugactl.workflows.setup.target import default_host_name

    name = host_name or default_host_name(manifest)
    if name not in [h.name for h in manifest.hosts]:
        raise UsageError(f"no host named {name!r} in the manifest", fix="pass --host with a manifest host name")
    return name


def pool_path(manifest: Any, host_name: str, pool: str | None) -> str:
    """The pool device this host uses: an explicit path, else the manifest's namespace as discovered."""
    if pool:
        return pool
    from belugactl.host import Host
    from belugactl.model.layout import resolve_layout
    from belugactl.workflows.setup.facts import observe
    from belugactl.workflows.setup.steps_pool import pool_dax_device
    from belugactl.workflows.setup.target import target_from_manifest

    target = target_from_manifest(manifest, host_name, layout=resolve_layout(manifest))
    facts = observe(Host.local(), target, {})
    dev = pool_dax_device(target, facts)
    if dev is None:
        raise EnvironmentProblem(
            f"host {host_name}: the pool's dax device does not exist",
            why="the probe maps the pool through the devdax namespace the manifest pins",
            fix=f"belugactl setup -f rack.yaml --host {host_name}",
        )
    return f"/dev/{dev}"


def probe_write(manifest_path: str, host_name: str | None, nonce: int, pool: str | None) -> dict[str, Any]:
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.mapping import PoolMapping

    manifest = load_manifest(manifest_path)
    name = _host_name(manifest, host_name)
    path = pool_path(manifest, name, pool)
    with PoolMapping.open(path, manifest) as mapping:
        offsets = probe_offsets(mapping.layout)
        index = [h.name for h in manifest.hosts].index(name)
        mapping.write(offsets[name], ProbeRecord.new(index, name, nonce).pack())
    return {"host": name, "pool": path, "offset": offsets[name], "nonce": nonce}


def probe_read(manifest_path: str, host_name: str | None, nonce: int, pool: str | None) -> dict[str, Any]:
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.mapping import PoolMapping

    manifest = load_manifest(manifest_path)
    name = _host_name(manifest, host_name)
    path = pool_path(manifest, name, pool)
    seen: dict[str, dict[str, Any]] = {}
    with PoolMapping.open(path, manifest, writable=False) as mapping:
        offsets = probe_offsets(mapping.layout)
        for index, entry in enumerate(manifest.hosts):
            raw = mapping.read(offsets[entry.name], PROBE_SIZE)
            status, detail = judge(raw, host_index=index, host=entry.name, nonce=nonce)
            seen[entry.name] = {"status": status, "detail": detail, "offset": offsets[entry.name]}
    return {"host": name, "pool": path, "seen": seen}
