"""The pool geometry: one type from layout and header alike, and every bad shape refused by name."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path

import pytest

from belugactl.errors import ExitCode, PoolMismatch
from belugactl.model.layout import resolve_layout
from belugactl.pool.geometry import PoolGeometry
from belugactl.pool.header import CLAIM_OFFSET, EPOCH_OFFSET, PoolHeader
from belugactl.pool.mapping import PoolMapping


def _recrc(buf: bytearray) -> None:
    (length,) = struct.unpack_from("<I", buf, 12)
    work = bytearray(buf[:length])
    work[16:20] = bytes(4)
    work[CLAIM_OFFSET : EPOCH_OFFSET + 64] = bytes(EPOCH_OFFSET + 64 - CLAIM_OFFSET)
    struct.pack_into("<I", buf, 16, zlib.crc32(work) & 0xFFFFFFFF)


def test_layout_and_header_give_the_same_geometry(manifest, pool_path: Path) -> None:
    layout = resolve_layout(manifest)
    ours = PoolGeometry.from_layout(layout)
    assert ours.rpc_offset == layout.rpc.offset and ours.ring_count == layout.rpc.ring_count
    assert ours.journal_offset == layout.journal.offset and ours.shared_kv_size == layout.shared_kv.size
    assert ours.rpc_size == layout.rpc.size
    header = PoolHeader.from_layout(manifest, layout, created_by="h0")
    assert header.geometry == ours and header.pool_size == layout.pool_size
    with PoolMapping.open(pool_path) as pool:
        assert pool.geometry == ours


def test_slot_offsets_are_bounds_checked(manifest) -> None:
    g = PoolGeometry.from_layout(resolve_layout(manifest))
    last = g.slot_offset(g.ring_count - 1, g.slots_per_ring - 1)
    assert last == g.rpc_offset + (g.ring_count - 1) * g.ring_stride + (g.slots_per_ring - 1) * g.slot_size
    assert last + g.slot_size <= g.rpc_offset + g.rpc_size
    assert g.ring_offset(1) == g.slot_offset(1, 0) == g.rpc_offset + g.ring_stride
    for ring, slot in ((g.ring_count, 0), (-1, 0), (0, g.slots_per_ring), (0, -1)):
        with pytest.raises(IndexError):
            g.slot_offset(ring, slot)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"slots_per_ring": 0}, "needs at least one"),
        ({"slot_size": 0}, "cache line"),
        ({"slot_size": 100}, "cache line"),
        ({"ring_stride": 64}, "rings would overlap"),
        ({"rpc_offset": 1 << 40}, "rpc area ends at"),
        ({"journal_size": 1 << 40}, "journal ends at"),
        ({"shared_kv_offset": 1 << 40}, "shared KV area ends at"),
        ({"rpc_offset": -4096}, "negative"),
        # An area inside the header region: a client's HELLO in ring 0 would overwrite the magic.
        ({"rpc_offset": 0}, "rpc area starts at 0, inside the header region"),
        ({"journal_offset": 4096}, "journal starts at 4096, inside the header region"),
        ({"shared_kv_offset": 64}, "shared KV area starts at 64, inside the header region"),
        ({"shared_kv_offset": (2 << 20) - 4096}, "inside the header region"),
    ],
)
def test_a_geometry_that_cannot_be_served_is_refused(manifest, change, words) -> None:
    good = PoolGeometry.from_layout(resolve_layout(manifest))
    with pytest.raises(PoolMismatch) as err:
        dataclasses.replace(good, **change)
    assert words in err.value.what
    assert err.value.exit_code == ExitCode.USAGE and err.value.fix


def test_overlapping_areas_are_refused(manifest) -> None:
    good = PoolGeometry.from_layout(resolve_layout(manifest))
    with pytest.raises(PoolMismatch, match="journal .* overlaps the shared KV area"):
        dataclasses.replace(good, shared_kv_offset=good.journal_offset + 4096)
    with pytest.raises(PoolMismatch, match="overlaps the journal"):
        dataclasses.replace(good, journal_offset=good.rpc_offset)


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "words"),
    [
        (164, "<I", 0, "needs at least one"),  # zero slots per ring: a ZeroDivisionError in the server before
        (168, "<I", 0, "cache line"),  # zero slot size
        (152, "<Q", 0, "rings would overlap"),  # ring stride
        (144, "<Q", 1 << 40, "rpc area ends at"),
        (176, "<Q", 1 << 40, "journal ends at"),
        (320, "<Q", 1 << 40, "shared KV area ends at"),
        (144, "<Q", 0, "rpc area starts at 0, inside the header region"),  # rings over the magic
        (176, "<Q", 256, "journal starts at 256, inside the header region"),  # over the epoch word
        (320, "<Q", 192, "shared KV area starts at 192, inside the header region"),  # over the claim word
    ],
)
def test_a_header_with_a_bad_geometry_is_refused_when_mapped(pool_path: Path, offset, fmt, value, words) -> None:
    with open(pool_path, "r+b") as f:
        buf = bytearray(f.read(4096))
        struct.pack_into(fmt, buf, offset, value)
        _recrc(buf)  # past the crc, so the geometry check itself must catch it
        f.seek(0)
        f.write(buf)
    with pytest.raises(PoolMismatch) as err:
        PoolMapping.open(pool_path)
    assert words in err.value.what and str(pool_path) in err.value.what


def test_a_host_partition_inside_the_header_region_is_refused(pool_path: Path) -> None:
    from belugactl.errors import InputError
    from belugactl.pool.header import FIXED_SIZE, NAME_FIELD, PoolHeader

    with open(pool_path, "rb") as f:
        buf = bytearray(f.read(4096))
    PoolHeader.unpack(bytes(buf))  # the layout's own header passes
    struct.pack_into("<Q", buf, FIXED_SIZE + NAME_FIELD, 0)  # host 0's partition at offset 0
    _recrc(buf)
    with pytest.raises(InputError, match="host entry 0 .* starts at 0, inside the first"):
        PoolHeader.unpack(bytes(buf))
