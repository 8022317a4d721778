"""The rack context: one manifest, loaded once, with what every command derives from it.

The CLI builds a `RackContext` once per command (`load_rack_context`) and hands it to the
workflows; no workflow loads the manifest or walks back from its path. What is costly or depends
on this machine (the layout, this host's entry, the pool device) is derived on first use and
kept, so a command resolves each at most once, and commands that never need one (the pool
device for `plan`) never decide it.

`select_host` is the one rule for "which manifest host is this machine", used by every command.
"""

from __future__ import annotations

import difflib
import hashlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.errors import InputError, UsageError

if TYPE_CHECKING:
    from belugactl.host.host import Host as HostAccess
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Host, Manifest


def _same_host(a: str, b: str) -> bool:
    """One name is the other plus domain labels: `gpu01` and `gpu01.rack.example`."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def _matches(manifest: Manifest, name: str) -> list[Host]:
    """Entries named exactly `name`; else those that are `name` with or without domain labels."""
    exact = [h for h in manifest.hosts if h.name == name]
    if exact:
        return exact
    return [h for h in manifest.hosts if _same_host(h.name, name)]


def select_host(
    manifest: Manifest, wanted: str | None, hostname: str | None, *, file: str = "the manifest"
) -> Host:
    """The manifest entry for `--host` (`wanted`), else for this machine's `hostname`.

    Exact name first, then a unique short-name match (`gpu01` finds `gpu01.x`, and
    `gpu01.x.example.org` finds `gpu01` or `gpu01.x`); without `--host`, a one-host manifest's
    only entry (a single box needs no naming). An unknown or ambiguous name is a usage error
    (exit 2) listing the manifest's hosts, with a did-you-mean when a name is close.
    """
    if wanted is None and len(manifest.hosts) == 1:
        return manifest.hosts[0]
    names = manifest.host_names()
    listed = "hosts in the manifest: " + ", ".join(names)
    asked = wanted if wanted is not None else hostname
    found = _matches(manifest, asked) if asked else []
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise UsageError(
            f"{asked!r} matches several hosts in {file}: {', '.join(h.name for h in found)}",
            why=listed,
            fix="pass --host with the full name",
        )
    close = difflib.get_close_matches(asked or "", names, n=3, cutoff=0.6) if asked else []
    if wanted is not None:
        hint = f"; did you mean --host {' or --host '.join(close)}?" if close else ""
        raise UsageError(
            f"no host named {wanted!r} in {file}{hint}",
            why=listed,
            fix="pass one of the names above with --host",
        )
    hint = f"; did you mean --host {' or --host '.join(close)}?" if close else ""
    raise UsageError(
        f"this machine ({hostname or 'hostname unknown'}) is not one of the hosts in {file}{hint}",
        why=listed,
        fix="pass --host NAME",
    )


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
