"""Why a host could not be reached, and what to do about it, from what the transport printed.

OpenSSH says why on its last stderr line (name resolution, refused, no route, keys, host key); `belugactl
lab exec` prints belugactl's own error with a `fix:` line. The reason is that line as printed; the fix is
ours, worded for the transport the operator chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from belugactl.workflows.rack.fanout import LabTransport, NodeResult, Transport


@dataclass(frozen=True)
class Unreachable:
    host: str
    reason: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "fix": self.fix}


# (what OpenSSH says, the fix); the first match wins. `{host}` and `{address}` are filled in.
_SSH_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("Could not resolve hostname", "Name or service not known", "nodename nor servname"),
        "DNS does not know {address}: check the host's address in the manifest (or its Host entry in the "
        "--ssh-config file); getent hosts {address}",
    ),
    (
        ("Connection refused",),
        "nothing listens for SSH on {address}: start sshd there, or give its port in an --ssh-config file",
    ),
    (
        (
            "No route to host",
            "Network is unreachable",
            "Connection timed out",
            "Operation timed out",
            "timed out during banner exchange",
        ),
        "the host is down or the network path is blocked: check its power and link; ping {address}",
    ),
    (
        ("Permission denied", "Too many authentication failures"),
        "SSH refused the key (BatchMode never asks for a password): --identity KEY, --ssh-user USER, or "
        "ssh-copy-id to {address}",
    ),
    (
        ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "the host's key is unknown or changed: check it, then add it to known_hosts (ssh-keyscan {address})",
    ),
)


def explain(result: NodeResult, transport: Transport) -> Unreachable:
    """The reason (the transport's own last words) and the fix for a host the transport did not reach."""
    lines = [line.strip() for line in result.stderr.strip().splitlines() if line.strip()]
    host, address = result.host, transport.address(result.host)
    if isinstance(transport, LabTransport):
        return _lab(host, lines, transport.lab_name)
    reason = lines[-1] if lines else f"ssh exited {result.returncode} without a message"
    for needles, fix in _SSH_FIXES:
        if any(n in reason for n in needles):
            return Unreachable(host, reason, fix.format(host=host, address=address))
    return Unreachable(host, reason, f"check that `ssh {address} true` works from here without a prompt")


def _lab(host: str, lines: list[str], lab_name: str) -> Unreachable:
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    reason = errors[0] if errors else (lines[-1] if lines else "belugactl lab exec failed")
    name = "" if lab_name == "default" else f" --name {lab_name}"
    if "is not up" in reason:
        return Unreachable(host, reason, f"start the lab: belugactl lab up{name}")
    return Unreachable(
        host,
        reason,
        f"see the guest's state with belugactl lab status{name}; bring the lab up again with "
        f"belugactl lab down{name} && belugactl lab up{name}",
    )
