"""The rack context: one manifest, loaded once, with what every command derives from it.

The CLI builds a `RackContext` once per command (`load_rack_context`) and hands it to the
workflows; no workflow loads the manifest or walks back from its path. What is costly or depends
on this machine (the layout, this host's entry, the pool device) is derived on first use and
kept, so a command resolves each at most once, and commands that never need one (the pool
device for `plan`) never decide it.

`select_host` (`model/host_select.py`) is the one rule for "which manifest host is this machine".
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.errors import InputError
from belugactl.model.host_select import select_host

if TYPE_CHECKING:
    from belugactl.host.host import Host as HostAccess
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Host, Manifest


@dataclass
class RackContext:
    """A loaded manifest and what commands derive from it, each derived at most once.

    `file` is the manifest's path as the user gave it (for messages); `path` is absolute (for the
    processes serve starts in other directories). `wanted_host` is `--host`, `pool_option` `--pool`.
    """

    manifest: Manifest
    file: str = "<manifest>"
    wanted_host: str | None = None
    pool_option: str | None = None
    path: Path = field(init=False)
    _layout: Any = field(default=None, init=False, repr=False)
    _layout_error: InputError | None = field(default=None, init=False, repr=False)
    _host: Any = field(default=None, init=False, repr=False)
    _pool: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.file).resolve()

    # --- the layout ----------------------------------------------------------------------------
    @property
    def layout(self) -> PoolLayout:
        """The resolved pool layout; raises LayoutDoesNotFit (exit 2) when the pool is too small."""
        found = self.layout_or_none()
        if found is None:
            assert self._layout_error is not None
            raise self._layout_error
        return found

    def layout_or_none(self) -> PoolLayout | None:
        """The layout, or None when it does not fit (doctor leaves that to `manifest check`)."""
        if self._layout is None and self._layout_error is None:
            from belugactl.model.layout import resolve_layout

            try:
                self._layout = resolve_layout(self.manifest)
            except InputError as exc:
                self._layout_error = exc
        return self._layout

    # --- this host -----------------------------------------------------------------------------
    def host(self, hostname: str | None = None) -> Host:
        """This machine's entry: `--host`, else the one matching `hostname` (default: this machine's)."""
        if self._host is None:
            seen = hostname if hostname is not None else socket.gethostname()
            self._host = select_host(self.manifest, self.wanted_host, seen, file=self.file)
        return self._host

    @property
    def host_name(self) -> str:
        return self.host().name

    # --- the pool device -----------------------------------------------------------------------
    def pool_path(self, host: HostAccess | None = None) -> str:
        """The pool on this host by the one rule (`belugactl.pool.device.pool_device`).

        A region-source pool's device is discovered on `host` (default: this machine) through
        setup's own finder, so both agree on which namespace is the pool.
        """
        if self._pool is None:
            from belugactl.pool.device import pool_device

            def discover() -> str | None:
                from belugactl.host.host import Host as LocalHost
                from belugactl.workflows.setup.observe import find_pool_device

                return find_pool_device(host or LocalHost.local(), self.manifest, self.host_name)

            self._pool = pool_device(
                self.manifest, explicit=self.pool_option, discover=discover, host_name=self.wanted_host
            )
        return self._pool

    # --- the file ------------------------------------------------------------------------------
    def source_sha256(self) -> str:
        """The manifest file's digest (rack doctor compares it across hosts)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def load_rack_context(file: str | Path, *, host: str | None = None, pool: str | None = None) -> RackContext:
    """Load (parse and validate) the manifest once and wrap it; ManifestError (exit 2) on problems."""
    from belugactl.model.manifest import load_manifest

    return RackContext(load_manifest(file), str(file), wanted_host=host, pool_option=pool)
