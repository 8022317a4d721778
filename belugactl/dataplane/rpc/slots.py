"""CXL-RPC slot operations: send a request, take it on the server, reply, collect the reply.

One ring per client in the pool's metadata area; each ring holds `slots_per_ring` fixed-size,
cache-line-aligned slots (see protocol.py for the 32-byte header). A client uses its slots in
order (slot = seq % slots_per_ring), so the server only watches one status word per ring: the
slot at its cursor for that ring.

Ordering rules (what makes this safe on a non-coherent CXL 2.0 pool):
- The writer stores the payload and header, writes the lines back and fences, and only then
  stores the status word (itself flushed).
- The reader waits on the status word with the line evicted before each load, then evicts the
  payload lines before reading them.
With `flush=False` (a file pool, an uncacheable pool, one host) the flushes are skipped; the
stores stay in program order, which x86 preserves for other cores.

The functions here use the native helper when it is built (`native.rpc_*`), else pure Python.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from belugactl.dataplane import native
from belugactl.dataplane.rpc.protocol import FREE, HEADER, HEADER_SIZE, MAGIC, REQ_READY, RESP_READY

_Q = struct.Struct("<Q")

# take() result: (ring index, seq, magic, epoch, op, length, payload bytes or None if the length is bad)
Taken = tuple[int, int, int, int, int, int, bytes | None]


def _py_send(buf: Any, off: int, seq: int, epoch: int, op: int, payload: bytes, flush: bool) -> None:
    n = len(payload)
    buf[off + HEADER_SIZE : off + HEADER_SIZE + n] = payload
    HEADER.pack_into(buf, off, FREE, seq, MAGIC, epoch & 0xFFFFFFFF, op, 0, n)
    if flush:
        native.flush(buf, off, HEADER_SIZE + n)
    native.store64(buf, off, REQ_READY, flush)


def _py_wait_reply(buf: Any, off: int, seq: int, max_payload: int, timeout_ns: int, flush: bool):
    """(code, epoch, payload) once RESP_READY, None on timeout; ValueError for a malformed reply."""
    status = native.wait64(buf, off, RESP_READY, timeout_ns, flush)
    if status != RESP_READY:
        return None
    if flush:
        native.flush(buf, off, HEADER_SIZE + max_payload, True)
    _st, rseq, magic, epoch, _op, code, length = HEADER.unpack_from(buf, off)
    if magic != MAGIC or rseq != seq or length > max_payload:
        native.store64(buf, off, FREE, flush)
        raise ValueError(f"malformed reply (magic {magic:#x}, seq {rseq} for {seq}, length {length})")
    payload = bytes(buf[off + HEADER_SIZE : off + HEADER_SIZE + length])
    native.store64(buf, off, FREE, flush)
    return code, epoch, payload


def _py_take(buf: Any, offsets: Any, start: int, max_payload: int, timeout_ns: int, flush: bool) -> Taken | None:
    count = len(offsets)
    unpack = _Q.unpack_from
    deadline = time.perf_counter_ns() + timeout_ns
    while True:
        for j in range(count):
            i = (start + j) % count
            off = offsets[i]
            if flush:
                native.flush(buf, off, 8, True)
            if unpack(buf, off)[0] == REQ_READY:
                if flush:
                    native.flush(buf, off, HEADER_SIZE + max_payload, True)
                _st, seq, magic, epoch, op, _code, length = HEADER.unpack_from(buf, off)
                payload = bytes(buf[off + HEADER_SIZE : off + HEADER_SIZE + length]) if length <= max_payload else None
                return i, seq, magic, epoch, op, length, payload
        if time.perf_counter_ns() >= deadline:
            return None


def _py_reply(buf: Any, off: int, seq: int, epoch: int, op: int, code: int, payload: bytes, flush: bool) -> None:
    n = len(payload)
    buf[off + HEADER_SIZE : off + HEADER_SIZE + n] = payload
    HEADER.pack_into(buf, off, REQ_READY, seq, MAGIC, epoch & 0xFFFFFFFF, op, code, n)
    if flush:
        native.flush(buf, off, HEADER_SIZE + n)
    native.store64(buf, off, RESP_READY, flush)


_n = native._native
if _n is not None and hasattr(_n, "rpc_send"):
    send = _n.rpc_send
    wait_reply = _n.rpc_wait_reply
    take = _n.rpc_take
    reply = _n.rpc_reply
else:
    send = _py_send
    wait_reply = _py_wait_reply
    take = _py_take
    reply = _py_reply
