"""The C helper's wire constants come from rpc/protocol.py: the committed header must match, and no C
file may define its own copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from belugactl.dataplane import native
from belugactl.dataplane.mds.ownership import LeaseCodec
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc import wire_header
from tests.dataplane.conftest import native_param

SRC = Path(wire_header.__file__).resolve().parents[1]
HEADER = SRC / "_native_wire.h"


def _defines(text: str) -> dict[str, int]:
    out = {}
    for name, value in re.findall(r"^#define (\w+) (0x[0-9A-Fa-f]+|\d+)u?$", text, re.MULTILINE):
        out[name] = int(value, 0)
    return out


def test_committed_header_is_what_protocol_py_renders() -> None:
    assert HEADER.read_text() == wire_header.render(), (
        "_native_wire.h is stale: python -m belugactl.dataplane.rpc.wire_header > belugactl/dataplane/_native_wire.h"
    )


def test_header_values_are_the_protocol_values() -> None:
    d = _defines(HEADER.read_text())
    assert d["RPC_MAGIC"] == p.MAGIC and d["HDR"] == p.HEADER_SIZE == 32
    assert (d["ST_FREE"], d["ST_REQ"], d["ST_RESP"]) == (p.FREE, p.REQ_READY, p.RESP_READY)
    assert d["LEASE_OWNER_BITS"] == p.LEASE_OWNER_BITS
    for op in p.Op:
        assert d[f"OP_{op.name}"] == op
    for code in p.Code:
        assert d[f"CODE_{code.name}"] == code
    assert [d[f"HDR_OFF_{n}"] for n, _o, _s in wire_header.HEADER_FIELDS] == [0, 8, 16, 20, 24, 26, 28]


def test_a_changed_constant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "MAGIC", p.MAGIC ^ 1)
    assert wire_header.render() != HEADER.read_text()  # the first test would fail


def test_no_c_file_keeps_its_own_copy_of_a_wire_constant() -> None:
    wire_names = set(_defines(HEADER.read_text()))
    for path in sorted(SRC.glob("_native*.[ch]")):
        if path == HEADER:
            continue
        text = path.read_text()
        redefined = wire_names & set(re.findall(r"^\s*#define (\w+)", text, re.MULTILINE))
        assert not redefined, f"{path.name} redefines {sorted(redefined)}: include _native_wire.h instead"
        assert f"{p.MAGIC:#x}".lower() not in text.lower(), f"{path.name} spells the magic number out"


@pytest.mark.parametrize("encode", [native_param(lambda *args: native._native.lease_encode(*args))])
def test_the_c_lease_ids_are_the_python_ones(encode) -> None:
    codec = LeaseCodec((0x01234567, 0x89ABCDEF, 0xDEADBEEF, 7))
    for seq, owner in ((1, 0), (2, 0), (1, 5), (123456789, (1 << 20) - 1), ((1 << 44) - 1, 3)):
        lid = encode(codec.key_bytes, seq, owner)
        assert lid == codec.encode(seq, owner) and codec.decode(lid) == (seq, owner)


def test_lease_ids_do_not_follow_each_other() -> None:
    codec = LeaseCodec()
    ids = [codec.encode(seq, 1) for seq in range(1, 200)]
    assert len(set(ids)) == len(ids)
    assert all(abs(b - a) > 1 << 20 for a, b in zip(ids, ids[1:], strict=False))
    assert [codec.decode(i) for i in ids] == [(seq, 1) for seq in range(1, 200)]
