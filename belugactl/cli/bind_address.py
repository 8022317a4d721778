"""`--bind ADDRESS`: refuse what is no address at all before any socket is opened.

A bad address (`999.1.1.1`) would otherwise surface as a listen error whose advice is about ports.
"""

from __future__ import annotations

import ipaddress
import re

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


def checked_bind(value: str | None, option: str = "--bind") -> str | None:
    """The address as given when it is an IP address or a host name; a UsageError (exit 2) otherwise."""
    if value is None:
        return None
    from belugactl.errors import UsageError

    text = value.strip()
    try:
        ipaddress.ip_address(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
        return text
    except ValueError:
        pass
    # All-numeric labels are an IPv4 address that ip_address refused (999.1.1.1), never a host name.
    numeric = all(label.isdigit() for label in text.split("."))
    if numeric or not _HOSTNAME_RE.match(text):
        raise UsageError(
            f"{option} {value}: not a valid IP address or host name",
            why="an IPv4 address is four numbers 0-255 (127.0.0.1); an IPv6 one looks like ::1",
            fix=f"give an address of this host: {option} 127.0.0.1 (this host only) or {option} 0.0.0.0 "
            "(every interface)",
        )
    return text
