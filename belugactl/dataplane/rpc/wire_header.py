"""Render the C header of the wire constants from protocol.py, so they are defined once.

`setup.py` writes `belugactl/dataplane/_native_wire.h` from `render()` before it compiles the
native helper, and the header is also committed (a build without Python at hand still has it);
`tests/dataplane/test_wire_constants.py` fails when the committed header and `render()` differ,
and the C sources check the slot struct against these offsets with static asserts.

    python -m belugactl.dataplane.rpc.wire_header > belugactl/dataplane/_native_wire.h
"""

from __future__ import annotations

import sys

from belugactl.dataplane.rpc import protocol as p

HEADER_FIELDS: tuple[tuple[str, int, int], ...] = (
    # (name, offset, size): the order and widths of protocol.HEADER ("<QQIIHHI")
    ("STATUS", 0, 8),
    ("SEQ", 8, 8),
    ("MAGIC", 16, 4),
    ("EPOCH", 20, 4),
    ("OP", 24, 2),
    ("CODE", 26, 2),
    ("LENGTH", 28, 4),
)


def _check_header_fields() -> None:
    fmt = p.HEADER.format.lstrip("<")
    sizes = {"Q": 8, "I": 4, "H": 2}
    off = 0
    for (name, want_off, want_size), ch in zip(HEADER_FIELDS, fmt, strict=True):
        if (off, sizes[ch]) != (want_off, want_size):
            raise AssertionError(f"HEADER field {name} is at {off}+{sizes[ch]}, the table says {want_off}+{want_size}")
        off += sizes[ch]


def render() -> str:
    _check_header_fields()
    lines = [
        "/* Generated from belugactl/dataplane/rpc/protocol.py by rpc/wire_header.py: do not edit.",
        " * Regenerate: python -m belugactl.dataplane.rpc.wire_header > belugactl/dataplane/_native_wire.h */",
        "#ifndef BELUGA_NATIVE_WIRE_H",
        "#define BELUGA_NATIVE_WIRE_H",
        "",
        f"#define RPC_MAGIC 0x{p.MAGIC:08X}u",
        f"#define HDR {p.HEADER_SIZE}",
        f"#define ST_FREE {p.FREE}",
        f"#define ST_REQ {p.REQ_READY}",
        f"#define ST_RESP {p.RESP_READY}",
        f"#define WIRE_MAX_KEY {p.MAX_KEY}",
        f"#define LEASE_OWNER_BITS {p.LEASE_OWNER_BITS}",
        f"#define FAST_REPLY_MAX {p.FAST_REPLY_MAX}",
        "",
    ]
    lines += [f"#define HDR_OFF_{name} {off}" for name, off, _size in HEADER_FIELDS]
    lines.append("")
    lines += [f"#define OP_{op.name} {int(op)}" for op in p.Op]
    lines.append("")
    lines += [f"#define CODE_{code.name} {int(code)}" for code in p.Code]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
