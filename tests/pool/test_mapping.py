from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.errors import ExitCode, PoolMismatch, PoolMissing
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.header import EPOCH_OFFSET
from belugactl.pool.mapping import PoolMapping


def test_file_pool_opens_verified_against_its_manifest(pool_path: Path, manifest) -> None:
    with PoolMapping.open(pool_path, manifest) as pool:
        assert pool.size == manifest.pool.size == pool_path.stat().st_size
        assert pool.layout is not None
        g = pool.geometry
        assert g.rpc_offset == pool.layout.rpc.offset and g.ring_count == pool.layout.rpc.ring_count
        assert g.shared_kv_offset == pool.layout.shared_kv.offset
        assert pool.header.layout_hash == pool.layout.layout_hash
        assert not pool.needs_flush  # a file is coherent on one host


def test_geometry_comes_from_the_header_without_a_manifest(pool_path: Path, manifest) -> None:
    with PoolMapping.open(pool_path) as pool:
        assert pool.layout is None
        assert pool.geometry.slot_size == manifest.layout.metadata.slot_size


def test_manifest_path_is_accepted(pool_path: Path, manifest_path: Path) -> None:
    with PoolMapping.open(str(pool_path), manifest_path) as pool:
        assert pool.layout is not None


def test_read_write_and_epoch_bump(pool_path: Path) -> None:
    with PoolMapping.open(pool_path) as pool:
        off = pool.geometry.shared_kv_offset
        pool.write(off, b"hello")
        assert pool.read(off, 5) == b"hello"
        pool.zero(off, 4096)
        assert pool.read(off, 5) == bytes(5)
        assert pool.epoch() == 0
        assert pool.bump_epoch() == 1 and pool.bump_epoch() == 2
        with pytest.raises(ValueError):
            pool.read(pool.size - 2, 5)
    with PoolMapping.open(pool_path) as again:  # the epoch lives on media, outside the crc
        assert again.epoch() == 2 and again.header.epoch == 2


def test_a_different_manifest_is_refused_with_a_field_diff(pool_path: Path, rack_text: str) -> None:
    from belugactl.model.manifest import load_manifest_text

    other = load_manifest_text(rack_text.replace("shared_kv: 40MiB", "shared_kv: 20MiB"))
    with pytest.raises(PoolMismatch) as err:
        PoolMapping.open(pool_path, other)
    assert err.value.exit_code == ExitCode.USAGE
    assert "shared_kv_size" in (err.value.why or "")


def test_missing_pool_is_an_environment_problem(tmp_path: Path) -> None:
    with pytest.raises(PoolMissing) as err:
        PoolMapping.open(tmp_path / "nope.bin")
    assert err.value.exit_code == ExitCode.ENVIRONMENT


def test_garbage_and_blank_headers_are_refused(tmp_path: Path) -> None:
    blank = tmp_path / "blank.bin"
    blank.write_bytes(bytes(4 << 20))
    with pytest.raises(PoolMismatch, match="never initialized"):
        PoolMapping.open(blank)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xa5" * (4 << 20))
    with pytest.raises(PoolMismatch, match="magic"):
        PoolMapping.open(junk)
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"x")
    with pytest.raises(PoolMismatch):
        PoolMapping.open(tiny)


def test_corrupted_header_byte_is_caught_by_the_crc(pool_path: Path) -> None:
    with open(pool_path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(PoolMismatch, match="crc"):
        PoolMapping.open(pool_path)


def test_create_refuses_to_overwrite_and_is_sparse(pool_path: Path, manifest) -> None:
    with pytest.raises(PoolMismatch):
        create_file_pool(pool_path, manifest)
    assert pool_path.stat().st_blocks * 512 < pool_path.stat().st_size  # sparse
    assert EPOCH_OFFSET % 8 == 0


def test_a_callers_layout_is_used_not_resolved_again_and_still_verified(
    pool_path: Path, manifest, rack_text: str, monkeypatch
) -> None:
    from belugactl.model import layout as layout_mod
    from belugactl.model.manifest import load_manifest_text

    known = layout_mod.resolve_layout(manifest)
    other_manifest = load_manifest_text(rack_text.replace("shared_kv: 40MiB", "shared_kv: 20MiB"))
    other = layout_mod.resolve_layout(other_manifest)

    def no_resolving(_manifest):
        raise AssertionError("PoolMapping.open resolved the layout its caller passed")

    monkeypatch.setattr(layout_mod, "resolve_layout", no_resolving)
    with PoolMapping.open(pool_path, manifest, layout=known, writable=False) as pool:
        assert pool.layout is known
    # A layout that disagrees with the header is refused like a disagreeing manifest.
    with pytest.raises(PoolMismatch) as err:
        PoolMapping.open(pool_path, other_manifest, layout=other)
    assert "shared_kv_size" in (err.value.why or "")
    with pytest.raises(TypeError, match="pass the manifest too"):
        PoolMapping.open(pool_path, layout=known)


def test_create_file_pool_uses_the_callers_layout(tmp_path: Path, manifest, monkeypatch) -> None:
    from belugactl.model import layout as layout_mod

    known = layout_mod.resolve_layout(manifest)
    monkeypatch.setattr(layout_mod, "resolve_layout", lambda _m: (_ for _ in ()).throw(AssertionError("resolved")))
    created = create_file_pool(tmp_path / "pool.bin", manifest, layout=known)
    with PoolMapping.open(created, manifest, layout=known, writable=False) as pool:
        assert pool.header.layout_hash == known.layout_hash and pool.size == known.pool_size
