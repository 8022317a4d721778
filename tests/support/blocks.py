"""Checksums for tests that commit blocks without writing their bytes.

Every commit carries the block's CRC32C (the server refuses one without it). A test that only
exercises metadata writes no bytes: its blocks hold what their fresh file pool holds, zeros, and
commit the CRC32C of those.
"""

from __future__ import annotations

import functools

from belugactl.dataplane import native


@functools.cache
def zeros_crc(nbytes: int) -> int:
    """CRC32C of `nbytes` zero bytes: what an unwritten block of a fresh file pool holds."""
    return native.crc32c(bytes(nbytes))
