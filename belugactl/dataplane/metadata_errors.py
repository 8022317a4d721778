"""Errors of the data plane, as typed `BelugaError`s so the CLI prints what/why/fix and exits cleanly.

The client-facing ones (`MetadataUnavailable`, `PoolFull`, `StaleEpoch`, ...) are what the vLLM
connector catches; all derive from `MetadataError` so a best-effort caller can catch one type.
"""

from __future__ import annotations

from belugactl.errors import BelugaError, EnvironmentProblem, InputError


class MetadataError(BelugaError):
    """Base of every error a metadata-server call can raise."""


class MetadataUnavailable(MetadataError):
    """The server did not answer in time, is not ready yet, or the connection broke."""

    exit_code = EnvironmentProblem.exit_code


class PoolFull(MetadataError):
    """No space in the shared KV area even after evicting every evictable block."""


class StaleEpoch(MetadataError):
    """The server restarted (the pool header's epoch moved on): leases and reservations are void.

    Drop every lease id and reservation token you hold, then call `KVIndexClient.reconnect()`.
    """


class AlreadyPresent(MetadataError):
    """`reserve` of a key that is committed already, or being written by another client."""


class ReservationExpired(MetadataError):
    """`commit`/`abort` of a token the server no longer knows (timed out and reclaimed, or never issued)."""


class NotOwner(MetadataError):
    """`commit`/`abort`/`release` of a token or lease another ring or connection got: refused, nothing changed."""


class CorruptBlock(MetadataError):
    """A block's bytes do not match the CRC32C its writer committed: a stalled writer overwrote
    its extents (docs/dataplane.md, "Checksums"). Treat it as a miss; never use the bytes."""


class RequestRejected(MetadataError):
    """The server refused a malformed request (bad length, opcode, arguments)."""

    exit_code = InputError.exit_code
