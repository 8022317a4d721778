"""The cross-host pool probe: is every host really looking at the same bytes at the same offsets?

Each host writes a 64-byte record (its index and name, a nonce chosen for this run, a time) into
the probe line of its own partition; then every host reads every partition's probe line at the
offsets its own layout gives. A host that maps another device, another namespace offset, or a
layout of its own making reads garbage there, and the visibility matrix shows it before that host
serves anyone's KV blocks.

The probe line is the first cache line of each host partition: the first `PARTITION_LABEL_SIZE`
bytes of a partition are reserved for belugactl's own records and never handed out for data.
"""

from __future__ import annotations

import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any

from belugactl.model.layout import PARTITION_LABEL_SIZE  # noqa: E402,F401  (re-exported for readers)

PROBE_MAGIC = b"BLGPROBE"
PROBE_SIZE = 64
# magic, host index, crc32, nonce, time_ns, host name (NUL padded)
_FORMAT = struct.Struct("<8sIIQQ32s")
assert _FORMAT.size == PROBE_SIZE


@dataclass(frozen=True)
class ProbeRecord:
    host_index: int
    host: str
    nonce: int
    time_ns: int

    def pack(self) -> bytes:
        name = self.host.encode()[:32]
        body = _FORMAT.pack(PROBE_MAGIC, self.host_index, 0, self.nonce, self.time_ns, name)
        crc = zlib.crc32(body)
        return _FORMAT.pack(PROBE_MAGIC, self.host_index, crc, self.nonce, self.time_ns, name)

    @classmethod
    def new(cls, host_index: int, host: str, nonce: int) -> ProbeRecord:
        return cls(host_index, host, nonce, time.time_ns())


def judge(raw: bytes, *, host_index: int, host: str, nonce: int) -> tuple[str, str]:
    """(status, detail) for the bytes found at a host's probe line. Never raises on bad bytes."""
    if len(raw) != PROBE_SIZE:
        return "garbage", f"short read: {len(raw)} bytes"
    magic, index, crc, found_nonce, time_ns, name_raw = _FORMAT.unpack(raw)
    if magic != PROBE_MAGIC:
        if raw == bytes(PROBE_SIZE):
            return "missing", "no probe record (all zero)"
        return "garbage", f"no probe magic (found {magic[:8].hex()})"
    body = _FORMAT.pack(magic, index, 0, found_nonce, time_ns, name_raw)
    if zlib.crc32(body) != crc:
        return "garbage", "probe record checksum mismatch"
    name = name_raw.rstrip(b"\0").decode(errors="replace")
    if index != host_index or name != host[:32]:
        return "wrong-host", f"record of host #{index} {name!r} where #{host_index} {host!r} was expected"
    if found_nonce != nonce:
        return "stale", f"record from another run (nonce {found_nonce:#x}, want {nonce:#x})"
    return "ok", f"written {max(0, time.time_ns() - time_ns) / 1e9:.1f} s ago"


def probe_offsets(layout: Any) -> dict[str, int]:
    """Host name -> absolute pool offset of its probe line (the start of its partition)."""
    return {p.host: p.offset for p in layout.partitions}
