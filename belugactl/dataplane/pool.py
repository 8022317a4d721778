"""Map the pool: a devdax device (`/dev/daxX.Y`) or a plain file (development, CI, benchmarks), one code path.

`PoolMapping.open` maps the whole pool MAP_SHARED, reads the on-media header (model/header.py),
and refuses the pool when the header is missing, corrupt, or disagrees with the manifest. Without
a manifest the geometry (RPC rings, shared KV area) comes from the header itself, so a client
needs only the pool path.

Coherence: a file or an uncacheable pool needs no flushes; a devdax pool mapped write-back and
shared by several hosts does, and `needs_flush` says so (the RPC and copy code then flush lines
through the native helper, and warn loudly when it is missing).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.dataplane import native
from belugactl.dataplane.errors import PoolMismatch, PoolMissing
from belugactl.errors import InputError
from belugactl.units import format_size

if TYPE_CHECKING:
    from belugactl.model.header import PoolHeader
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Manifest

DEVDAX_ALIGN = 2 << 20


@dataclass(frozen=True)
class Geometry:
    """The offsets the data plane uses, as recorded in the header (identical to the layout's)."""

    pool_size: int
    rpc_offset: int
    ring_count: int
    slots_per_ring: int
    slot_size: int
    ring_stride: int
    journal_offset: int
    journal_size: int
    shared_kv_offset: int
    shared_kv_size: int

    @classmethod
    def from_header(cls, h: PoolHeader) -> Geometry:
        return cls(
            pool_size=h.pool_size,
            rpc_offset=h.rpc_offset,
            ring_count=h.rpc_ring_count,
            slots_per_ring=h.rpc_slots_per_ring,
            slot_size=h.rpc_slot_size,
            ring_stride=h.rpc_ring_stride,
            journal_offset=h.journal_offset,
            journal_size=h.journal_size,
            shared_kv_offset=h.shared_kv_offset,
            shared_kv_size=h.shared_kv_size,
        )

    def slot_offset(self, ring: int, slot: int) -> int:
        return self.rpc_offset + ring * self.ring_stride + slot * self.slot_size


def _load_manifest(manifest: Manifest | str | os.PathLike[str] | None) -> Manifest | None:
    if manifest is None or not isinstance(manifest, str | os.PathLike):
        return manifest
    from belugactl.model.manifest import load_manifest

    return load_manifest(manifest)


def _is_devdax(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


class PoolMapping:
    """One MAP_SHARED mapping of the whole pool.

    Attributes: `path`, `size` (bytes mapped), `buf` (a writable memoryview of the pool),
    `header` (the verified PoolHeader), `layout` (PoolLayout when opened with a manifest, else
    None), `geometry` (from the header, always set), `is_devdax`, `needs_flush`.
    """

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        header: PoolHeader,
        layout: PoolLayout | None,
        *,
        is_devdax: bool,
        uncacheable: bool = False,
        shared_by_hosts: bool = False,
    ) -> None:
        self.path = path
        self._mm = mm
        self.buf = memoryview(mm)
        self.size = len(mm)
        self.header = header
        self.layout = layout
        self.geometry = Geometry.from_header(header)
        self.is_devdax = is_devdax
        from belugactl.model.header import EPOCH_OFFSET

        self._epoch_off = EPOCH_OFFSET
        # Flushes matter only for a write-back devdax pool that other hosts also map.
        self.needs_flush = is_devdax and not uncacheable and shared_by_hosts
        self.coherence_warning = native.require_coherence(shared_by_hosts=self.needs_flush)

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path_or_dev: str | os.PathLike[str],
        manifest: Manifest | str | os.PathLike[str] | None = None,
        *,
        writable: bool = True,
    ) -> PoolMapping:
        """Map and verify a pool; raise PoolMissing (exit 3) or PoolMismatch (exit 2) with the fix."""
        from belugactl.model.header import MAX_HEADER_SIZE, PoolHeader

        path = Path(path_or_dev)
        loaded = _load_manifest(manifest)
        if not path.exists():
            raise PoolMissing(
                f"pool {path} does not exist",
                why="the metadata server and clients map the pool from this path",
                fix="run `belugactl setup -f rack.yaml` (devdax) or create a file pool for development",
            )
        devdax = _is_devdax(path)
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise PoolMissing(
                f"cannot open pool {path}: {exc.strerror}",
                why="the pool device or file is not readable/writable by this user",
                fix=f"run as a user with access to {path} (udev rule from `belugactl setup`, or root)",
            ) from exc
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            if devdax:
                # A devdax device has no file size: map the header region, read the pool size from it.
                size = DEVDAX_ALIGN
            else:
                size = os.fstat(fd).st_size
                if size < DEVDAX_ALIGN:
                    raise PoolMismatch(
                        f"pool file {path} is {format_size(size)}, smaller than the 2 MiB header region",
                        fix="create it with `belugactl serve -f rack.yaml --pool FILE --create-pool` "
                        "or belugactl.dataplane.pool.create_file_pool(path, manifest)",
                    )
            try:
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            except OSError as exc:
                if not devdax or exc.errno != errno.EINVAL:
                    raise
                # A devdax device with a 1 GiB alignment refuses a 2 MiB mapping.
                size = 1 << 30
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            try:
                header = PoolHeader.unpack(mm[:MAX_HEADER_SIZE])
            except InputError as exc:
                mm.close()
                fix = exc.fix or "run belugactl setup"
                raise PoolMismatch(f"pool {path}: {exc.what}", why=exc.why, fix=fix) from None
            if devdax:
                mm.close()
                size = header.pool_size
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            elif header.pool_size > size:
                mm.close()
                raise PoolMismatch(
                    f"pool {path} is {format_size(size)} but its header says {format_size(header.pool_size)}",
                    fix="recreate the pool file; it was truncated",
                )
        except OSError as exc:
            raise PoolMissing(
                f"cannot map pool {path}: {exc.strerror or exc}",
                why="mmap of the pool failed (size, alignment or permissions)",
                fix="check the device with `belugactl discover` and the manifest's pool.size / pool.align",
            ) from None
        finally:
            os.close(fd)

        layout = None
        uncacheable = False
        # Without a manifest the header's host table says whether other hosts map this pool; the
        # memory type is unknown then, so assume write-back (a needless flush is only slower, a
        # missing one reads stale lines). A client given just cxl:///dev/daxX.Y#N lands here.
        shared = len(header.hosts) > 1
        if loaded is not None:
            try:
                layout = verify_against_manifest(path, header, loaded)
            except PoolMismatch:
                mm.close()
                raise
            uncacheable = getattr(getattr(loaded, "caching", None), "pool_memory_type", "") == "uncachable"
            shared = len(loaded.hosts) > 1
        return cls(path, mm, header, layout, is_devdax=devdax, uncacheable=uncacheable, shared_by_hosts=shared)

    # --- access -------------------------------------------------------------------------------
    def read(self, offset: int, n: int) -> bytes:
        self._check(offset, n)
        if self.needs_flush:
            native.flush(self.buf, offset, n, True)
        return bytes(self.buf[offset : offset + n])

    def write(self, offset: int, data: bytes | bytearray | memoryview, *, publish: bool = True) -> None:
        """Store bytes; with `publish` on a non-coherent pool, write them back and fence."""
        n = len(data)
        self._check(offset, n)
        if self.needs_flush and publish:
            native.copy(self.buf, offset, data, 0, n, True)
        else:
            self.buf[offset : offset + n] = data

    def zero(self, offset: int, n: int) -> None:
        self._check(offset, n)
        step = 1 << 20
        blank = bytes(min(step, n))
        pos = offset
        end = offset + n
        while pos < end:
            k = min(step, end - pos)
            self.write(pos, blank[:k])
            pos += k

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(f"range [{offset:#x}, +{n}) is outside the {format_size(self.size)} pool")

    # --- epoch --------------------------------------------------------------------------------
    def epoch(self) -> int:
        if self.needs_flush:
            native.flush(self.buf, self._epoch_off, 8, True)
        return native.load64(self.buf, self._epoch_off)

    def bump_epoch(self) -> int:
        """Atomically add one to the header's epoch word; return the new epoch."""
        from belugactl.model.header import EPOCH_OFFSET

        old = native.fetch_add64(self.buf, EPOCH_OFFSET, 1)
        native.flush(self.buf, EPOCH_OFFSET, 8)
        return old + 1

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if self._mm.closed:
            return
        self.buf.release()
        # Someone may still hold a view (a numpy array, a memoryview slice): the mapping then lives
        # until they drop it, and the OS unmaps it.
        with contextlib.suppress(BufferError):
            self._mm.close()

    def __enter__(self) -> PoolMapping:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "path": str(self.path),
            "size": self.size,
            "devdax": self.is_devdax,
            "needs_flush": self.needs_flush,
            "native": native.AVAILABLE,
            "epoch": self.epoch(),
            "rings": g.ring_count,
            "slots_per_ring": g.slots_per_ring,
            "slot_size": g.slot_size,
            "shared_kv": {"offset": g.shared_kv_offset, "size": g.shared_kv_size},
            "layout_hash": self.header.layout_hash,
        }


def verify_against_manifest(path: Path, header: PoolHeader, manifest: Manifest) -> PoolLayout:
    """The layout this manifest implies, after checking the header agrees with it field by field."""
    from belugactl.model.header import PoolHeader, diff
    from belugactl.model.layout import resolve_layout

    layout = resolve_layout(manifest)
    expected = PoolHeader.from_layout(manifest, layout, created_by=header.created_by)
    problems = diff(expected, header)
    if problems:
        lines = [f"{field}: manifest {ours!r}, pool {theirs!r}" for field, ours, theirs in problems[:12]]
        raise PoolMismatch(
            f"pool {path} was laid out for a different manifest ({len(problems)} field(s) differ)",
            why="\n".join(lines),
            fix="use the manifest the pool was set up with, or re-run `belugactl setup --force` to re-initialize "
            "(destroys the pool contents)",
        )
    return layout


def create_file_pool(
    path: str | os.PathLike[str],
    manifest: Manifest | str | os.PathLike[str],
    *,
    created_by: str | None = None,
    exist_ok: bool = False,
) -> Path:
    """Write a sparse file of the manifest's pool size with a valid header (development and CI).

    The file is created with O_CREAT|O_EXCL|O_NOFOLLOW: a symlink planted at the path (dangling or
    not) is refused, never followed, so nobody can aim the pool's bytes at a file of their choosing.
    Its mode is 0600 (every tenant's KV bytes live in it), or the manifest's `pool.permissions.mode`
    where the manifest sets one; the umask does not widen or narrow it.
    """
    from belugactl.model.header import PoolHeader
    from belugactl.model.layout import resolve_layout

    loaded = _load_manifest(manifest)
    assert loaded is not None
    layout = resolve_layout(loaded)
    header = PoolHeader.from_layout(loaded, layout, created_by=created_by or socket.gethostname()[:47] or "belugactl")
    target = Path(path)
    mode = loaded.pool.permissions.mode_bits if "permissions" in loaded.pool.model_fields_set else 0o600
    try:
        existing = os.lstat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISLNK(existing.st_mode):
        raise PoolMismatch(
            f"{target} is a symbolic link; refusing to create a pool through it",
            why="a link at a pool path would send every tenant's KV bytes wherever it points",
            fix="remove the link, or pass the real path of a file in a directory only you can write",
        )
    if existing is not None and not exist_ok:
        raise PoolMismatch(f"{target} exists already", fix="remove it or pass exist_ok=True to overwrite its header")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise PoolMismatch(f"{target} is not a regular file", fix="a file pool is a regular file; pass another path")
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (0 if existing is not None else os.O_CREAT | os.O_EXCL)
    try:
        fd = os.open(target, flags, mode)
    except FileExistsError:
        raise PoolMismatch(
            f"{target} appeared while the pool was being created (a file or a link put there by someone else)",
            fix="choose a path in a directory only you can write, e.g. your home directory",
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PoolMismatch(f"{target} is a symbolic link; refusing to follow it", fix="remove the link") from None
        raise PoolMissing(
            f"cannot create the pool file {target}: {exc.strerror or exc}", fix="choose a writable path"
        ) from None
    if existing is None:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
    with os.fdopen(fd, "r+b") as f:
        f.truncate(layout.pool_size)
        # Magic last, so a reader never sees a magic in front of a half-written record.
        f.write(header.pack(include_magic=False))
        f.flush()
        f.seek(0)
        f.write(header.pack()[:8])
        f.flush()
        os.fsync(f.fileno())
    return target
