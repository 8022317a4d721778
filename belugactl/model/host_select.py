"""Which manifest host is this machine: `select_host`, the one rule every command uses.

Pure manifest data (names in, an entry or a usage error out), so the rack context and setup's target
both take it from here, below either of them.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from belugactl.errors import UsageError

if TYPE_CHECKING:
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
