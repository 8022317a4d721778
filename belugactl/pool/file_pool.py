"""A pool in a plain file: development, CI, benchmarks, and the lab's shared backing file.

The file is sparse and laid out exactly like a device: the manifest's pool size, with a valid
header at offset 0, so `PoolMapping.open` treats it like `/dev/daxX.Y` (minus the flushes).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from belugactl.dataplane.errors import PoolMismatch
from belugactl.pool.header import PoolHeader
from belugactl.pool.mapping import load_manifest_arg

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Manifest


def create_file_pool(
    path: str | os.PathLike[str],
    manifest: Manifest | str | os.PathLike[str],
    *,
    created_by: str | None = None,
    exist_ok: bool = False,
) -> Path:
    """Write a sparse file of the manifest's pool size with a valid header (development and CI)."""
    from belugactl.model.layout import resolve_layout

    loaded = load_manifest_arg(manifest)
    assert loaded is not None
    layout = resolve_layout(loaded)
    header = PoolHeader.from_layout(loaded, layout, created_by=created_by or socket.gethostname()[:47] or "belugactl")
    target = Path(path)
    if target.exists() and not exist_ok:
        raise PoolMismatch(f"{target} exists already", fix="remove it or pass exist_ok=True to overwrite its header")
    with open(target, "r+b" if target.exists() else "w+b") as f:
        f.truncate(layout.pool_size)
        # Magic last, so a reader never sees a magic in front of a half-written record.
        f.write(header.pack(include_magic=False))
        f.flush()
        f.seek(0)
        f.write(header.pack()[:8])
        f.flush()
        os.fsync(f.fileno())
    return target
