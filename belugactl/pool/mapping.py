"""The one mapping of the pool: a devdax device (`/dev/daxX.Y`) or a plain file, for every user.

Two ways in, one class:

- `PoolMapping.open(path, manifest=None)`: the data plane's (metadata server, clients, the vLLM
  connector, the rack probe, preflight). It maps the whole pool MAP_SHARED, reads the on-media
  header (pool/header.py) and refuses the pool when the header is missing, corrupt, or disagrees
  with the manifest. Without a manifest the geometry comes from the header itself, so a client
  needs only the pool path.
- `PoolMapping.window(host, device, length)`: setup's and doctor's. It maps the first `length`
  bytes under the Host's root without reading the header, because setup writes that header (with
  a compare-and-swap of its claim word) and doctor reports on whatever is there, blank or not.
  A device-dax node only supports mmap (no read/write syscalls), in multiples of its alignment,
  so even a 4 KiB read maps a whole aligned window.

Coherence: a file or an uncacheable pool needs no flushes; a devdax pool mapped write-back and
shared by several hosts does, and `needs_flush` says so: reads then drop this host's cached lines
first, writes go out with non-temporal stores and a fence (the native helper; without it the code
warns loudly rather than pretend). A window asks for flushes explicitly (setup does when the
native helper is built); its writes are also msync'ed, so a file pool holds the header on disk.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.dataplane import native
from belugactl.errors import EnvironmentProblem, InputError, PoolMismatch, PoolMissing, StepFailed
from belugactl.pool import lock
from belugactl.pool.header import EPOCH_OFFSET, PoolHeader, diff
from belugactl.units import format_size

if TYPE_CHECKING:
    import threading

    from belugactl.host.host import Host
    from belugactl.model.layout import PoolLayout
    from belugactl.model.manifest_schema import Manifest
    from belugactl.pool.geometry import PoolGeometry

DEVDAX_ALIGN = 2 << 20


def load_manifest_arg(manifest: Manifest | str | os.PathLike[str] | None) -> Manifest | None:
    """A manifest, or the path of one (loaded here), or None."""
    if manifest is None or not isinstance(manifest, str | os.PathLike):
        return manifest
    from belugactl.model.manifest import load_manifest

    return load_manifest(manifest)


def pool_missing(
    path: Path, manifest: Manifest | str | os.PathLike[str] | None, loaded: Manifest | None = None
) -> PoolMissing:
    """The error for a pool path that does not exist, its fix naming the manifest's real file."""
    import shlex

    named = _manifest_arg(manifest, loaded if loaded is not None else load_manifest_arg(manifest))
    return PoolMissing(
        f"pool {path} does not exist",
        why="the metadata server and clients map the pool from this path",
        fix=f"a file pool (development, CI): `belugactl pool create-file -f {named} {shlex.quote(str(path))}`; "
        f"a devdax pool: `belugactl setup -f {named}`",
    )


def _manifest_arg(manifest: Manifest | str | os.PathLike[str] | None, loaded: Manifest | None) -> str:
    """The manifest's file for a fix's `-f`: the path given, or the one the manifest was loaded from;
    the README's placeholder only when neither is known."""
    import shlex

    from belugactl.model.manifest import manifest_source

    if isinstance(manifest, str | os.PathLike):
        return shlex.quote(os.fspath(manifest))
    source = manifest_source(loaded) if loaded is not None else None
    return shlex.quote(str(source)) if source is not None else "rack.yaml"


def _is_devdax(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _account_uid(name: str) -> int | None:
    if name.isdigit():
        return int(name)
    import pwd

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_pool_file_owner(
    path: Path, st: os.stat_result, manifest: Manifest | None, *, euid: int | None = None
) -> None:
    """A pool file is trusted only as far as its owner is: whoever can write it rewrites the header
    and every block a reader copies. Refused: a world-writable file; a file owned by someone other
    than this user or root, unless the manifest's pool.permissions.owner names that owner (a rack
    that shares one file on purpose). Root therefore opens only root's pool files, or the named
    owner's. Device nodes are setup's business (udev rule, doctor's dax.permissions check)."""
    if not stat.S_ISREG(st.st_mode):
        return
    if st.st_mode & 0o002:
        raise InputError(
            f"pool file {path} is world-writable (mode {stat.S_IMODE(st.st_mode):04o})",
            why="any local user could rewrite its header and the KV blocks every reader copies",
            fix=f"chmod o-w {path} (`belugactl pool create-file` makes pool files 0600)",
        )
    me = os.geteuid() if euid is None else euid
    if st.st_uid in (me, 0):
        return
    permissions = getattr(getattr(manifest, "pool", None), "permissions", None)
    named = _account_uid(permissions.owner) if permissions is not None else None
    if named is not None and named == st.st_uid and "owner" in permissions.model_fields_set:
        return
    raise InputError(
        f"pool file {path} belongs to {_user_name(st.st_uid)}, not to {_user_name(me)}",
        why="its owner can rewrite the header and every block this process would read or serve",
        fix="use a pool file this user created (`belugactl pool create-file`); if the rack shares this file on "
        "purpose, name its owner in the manifest's pool.permissions.owner and pass the manifest (-f)",
    )


# Linux's MADV_POPULATE_READ (5.14); Python's mmap module names it only from 3.13 on.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
PREFAULT_CHUNK = 64 << 20


class PoolMapping:
    """One MAP_SHARED mapping of the pool (all of it, or a window at its start).

    Attributes: `path`, `size` (bytes mapped), `buf` (a writable memoryview of the mapping),
    `layout` (PoolLayout when opened with a manifest, else None), `is_devdax`, `needs_flush`.
    `header` and `geometry` exist for a verified mapping (`open`); a window has none yet.
    """

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        header: PoolHeader | None,
        layout: PoolLayout | None,
        *,
        is_devdax: bool,
        needs_flush: bool,
        sync_writes: bool = False,
    ) -> None:
        self.path = path
        self._mm = mm
        self.buf = memoryview(mm)
        self.size = len(mm)
        self._header = header
        self.layout = layout
        self.is_devdax = is_devdax
        self.needs_flush = needs_flush
        self._sync_writes = sync_writes
        self.coherence_warning = native.require_coherence(shared_by_hosts=needs_flush) if header is not None else None

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path_or_dev: str | os.PathLike[str],
        manifest: Manifest | str | os.PathLike[str] | None = None,
        *,
        writable: bool = True,
        layout: PoolLayout | None = None,
    ) -> PoolMapping:
        """Map and verify a pool; raise PoolMissing (exit 3) or PoolMismatch (exit 2) with the fix.

        `layout`: the manifest's resolved layout, when the caller already has it (a RackContext
        does), so it is not resolved again; the header is still checked against it field by field.
        It needs the manifest too (the pool uuid comes from there)."""
        path = Path(path_or_dev)
        if layout is not None and manifest is None:
            raise TypeError("PoolMapping.open: a layout is verified against its manifest; pass the manifest too")
        loaded = load_manifest_arg(manifest)
        if not path.exists():
            raise pool_missing(path, manifest, loaded)
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
            # What was opened, not what the path named a moment before.
            check_pool_file_owner(path, os.fstat(fd), loaded)
        except InputError:
            os.close(fd)
            raise
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
                        fix=f"create it with `belugactl pool create-file -f {_manifest_arg(manifest, loaded)} FILE` "
                        "or belugactl.pool.file_pool.create_file_pool(path, manifest)",
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
                from belugactl.pool.membership import read_header

                # read again if a membership rewrite is half-way (pool/membership.py)
                header = read_header(lambda off, n: mm[off : off + n])
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

        verified = None
        uncacheable = False
        # Without a manifest the header's host table says whether other hosts map this pool; the
        # memory type is unknown then, so assume write-back (a needless flush is only slower, a
        # missing one reads stale lines). A client given just cxl:///dev/daxX.Y#N lands here.
        shared = len(header.hosts) > 1
        if loaded is not None:
            try:
                verified = verify_against_manifest(path, header, loaded, layout)
            except PoolMismatch:
                mm.close()
                raise
            uncacheable = getattr(getattr(loaded, "caching", None), "pool_memory_type", "") == "uncachable"
            shared = len(loaded.hosts) > 1
        # Flushes matter only for a write-back devdax pool that other hosts also map.
        needs_flush = devdax and not uncacheable and shared
        return cls(path, mm, header, verified, is_devdax=devdax, needs_flush=needs_flush)

    @classmethod
    def window(cls, host: Host, device: str, length: int, *, writable: bool = True, flush: bool = False) -> PoolMapping:
        """Map the first `length` bytes of `device` (under the host's root), header or not.

        `flush`: treat the pool as shared with other hosts (drop cached lines before each read,
        write back and fence after each write); only a writable window flushes."""
        path = host.path(device)
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except FileNotFoundError as exc:
            raise StepFailed(f"{device} does not exist", fix="run `belugactl setup` first") from exc
        except PermissionError as exc:
            raise EnvironmentProblem(
                f"cannot open {device}", why=str(exc), fix="run as root or as the pool's owner group"
            ) from exc
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, length, mmap.MAP_SHARED, prot)
        except (OSError, ValueError) as exc:
            raise StepFailed(
                f"cannot map the first {length} bytes of {device}",
                why=str(exc),
                fix="the device must be at least this large and its align must divide the length",
            ) from exc
        finally:
            os.close(fd)
        return cls(
            Path(path),
            mm,
            None,
            None,
            is_devdax=_is_devdax(Path(path)),
            needs_flush=flush and writable,
            sync_writes=True,
        )

    # --- what was verified --------------------------------------------------------------------
    @property
    def header(self) -> PoolHeader:
        if self._header is None:
            raise PoolMismatch(
                f"{self.path} is mapped as a raw window: its header was not read",
                fix="open the pool with PoolMapping.open to use its header and geometry",
            )
        return self._header

    @property
    def geometry(self) -> PoolGeometry:
        return self.header.geometry

    # --- access -------------------------------------------------------------------------------
    def read(self, offset: int, n: int) -> bytes:
        self._check(offset, n)
        if self.needs_flush:
            native.flush(self.buf, offset, n, True)  # drop stale lines: another host may have written
        return bytes(self.buf[offset : offset + n])

    def write(self, offset: int, data: bytes | bytearray | memoryview, *, publish: bool = True) -> None:
        """Store bytes; with `publish` on a non-coherent pool, write them back and fence."""
        n = len(data)
        self._check(offset, n)
        if self.needs_flush and publish:
            native.copy(self.buf, offset, data, 0, n, True)
        else:
            self.buf[offset : offset + n] = data
        self._sync()

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

    def flush(self, offset: int = 0, size: int = 0) -> None:
        """Write `size` bytes at `offset` back out of this host's caches, then fence."""
        self._check(offset, size)
        if self.needs_flush and size:
            native.flush(self.buf, offset, size)
            native.fence()
        self._sync()

    def sync(self) -> None:
        """After native code stored into `buf` directly: msync, where this mapping syncs its writes."""
        self._sync()

    def _sync(self) -> None:
        if self._sync_writes:
            # msync: reaches the file for file-backed pools; device-dax mappings are the media itself.
            with contextlib.suppress(OSError):
                self._mm.flush()

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(f"range [{offset:#x}, +{n}) is outside the {format_size(self.size)} pool")

    # --- 64-bit words: the claim and the epoch --------------------------------------------------
    def load_u64(self, offset: int) -> int:
        if self.needs_flush:
            native.flush(self.buf, offset, 8, True)
        return int(native.load64(self.buf, offset))

    def cas_u64(self, offset: int, expected: int, new: int) -> int:
        """Store `new` if the word holds `expected`; return the value found (== expected on success).

        Two processes on this host are serialised by the pool's flock (lock.exclusive), which makes
        the swap atomic here even without the native helper's hardware compare-and-swap."""
        if offset % 8:
            raise ValueError("the claim word must be 8-byte aligned")
        self._check(offset, 8)
        with lock.exclusive(self.path):
            if self.needs_flush:
                native.flush(self.buf, offset, 8, True)
            found = int(native.cas64(self.buf, offset, expected, new))
            self.flush(offset, 8)
            return found

    def epoch(self) -> int:
        return self.load_u64(EPOCH_OFFSET)

    def bump_epoch(self) -> int:
        """Atomically add one to the header's epoch word; return the new epoch."""
        if self.needs_flush:  # another host's bump may be in memory, not in this CPU's copy of the line
            native.flush(self.buf, EPOCH_OFFSET, 8, True)
        old = native.fetch_add64(self.buf, EPOCH_OFFSET, 1)
        native.flush(self.buf, EPOCH_OFFSET, 8)
        return old + 1

    # --- page tables --------------------------------------------------------------------------
    def prefault(
        self,
        offset: int = 0,
        length: int | None = None,
        *,
        chunk: int = PREFAULT_CHUNK,
        stop: threading.Event | None = None,
    ) -> int:
        """Fill this process's page tables for `length` bytes from `offset` without reading or
        writing a byte (MADV_POPULATE_READ, Linux 5.14); returns the bytes covered.

        Why: a file pool is mapped in 4 KiB pages, and a block another process wrote (another
        instance's save) is not in this process's page tables yet. Reading it costs a page fault
        every 16 pages (the kernel's fault-around): about 190 on a 12 MiB pool hit of the CPU demo,
        1.3 ms of the copy. Done once ahead of time, in `chunk`-sized calls (each holds the GIL, so
        a thread doing this lets the others run between chunks). `stop`, once set, ends it early.
        A devdax pool faults once per 2 MiB or 1 GiB page and needs none of this.

        Raises OSError where the kernel has no MADV_POPULATE_READ (EINVAL) or the range cannot be
        read (EFAULT, EIO): the caller decides whether that matters."""
        end = self.size if length is None else min(self.size, offset + length)
        page = mmap.PAGESIZE
        pos = offset - offset % page
        done = 0
        while pos < end and not (stop is not None and stop.is_set()):
            n = min(chunk, end - pos)
            self._mm.madvise(MADV_POPULATE_READ, pos, n)
            pos += n
            done += n
        return done

    # --- locks --------------------------------------------------------------------------------
    def server_lock(self) -> lock.ServerLock:
        """One metadata server per pool per host; raises EnvironmentProblem when another holds it."""
        return lock.ServerLock.acquire(self.path)

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


def reinit_fix(path: Path, *, manifest_changed: bool = True) -> str:
    """How to get a pool whose header matches the manifest again, and what that destroys."""
    first = "use the manifest the pool was set up with, or " if manifest_changed else ""
    lost = (
        "this DESTROYS the pool's contents: every cached KV block (recomputed on demand), the metadata "
        "server's index journal and whatever the host partitions hold; stop serving on every host first"
    )
    if _is_devdax(path):
        return f"{first}re-initialize it: `belugactl setup -f MANIFEST --force` on one host rewrites the header; {lost}"
    return (
        f"{first}re-create the file pool: remove {path}, then `belugactl pool create-file -f MANIFEST {path}` "
        f"(or serve with --create-pool); {lost}"
    )


def verify_against_manifest(
    path: Path, header: PoolHeader, manifest: Manifest, layout: PoolLayout | None = None
) -> PoolLayout:
    """The layout this manifest implies (resolved here unless given), after checking the header
    agrees with it field by field."""
    if layout is None:
        from belugactl.model.layout import resolve_layout

        layout = resolve_layout(manifest)
    expected = PoolHeader.from_layout(manifest, layout, created_by=header.created_by)
    problems = diff(expected, header)
    if problems:
        from belugactl.pool import membership

        if (change := membership.compare(expected, header, layout)) is not None:
            how = (
                f"`belugactl setup -f MANIFEST` on one host records it (or `belugactl pool members {path} -f MANIFEST`"
                " for a pool file)"
            )
            raise PoolMismatch(
                f"pool {path} has another membership than this manifest (version {change.version}): "
                + "; ".join(change.lines()),
                why="the pool is laid out for this manifest's capacity, but its header lists other hosts in its "
                "slots; hosts that disagree on who owns which slot would share partitions and CXL-RPC rings",
                fix=f"{how}: a membership change keeps every cached KV block; or use the manifest the rack "
                "runs with",
            )
        lines = [f"{field}: manifest {ours!r}, pool {theirs!r}" for field, ours, theirs in problems[:12]]
        from belugactl.model.layout import stale_layout_note

        note = stale_layout_note(
            manifest, layout, header.layout_hash, header.geometry.ring_count,
            same_pool=header.pool_uuid == expected.pool_uuid,
        )  # fmt: skip
        raise PoolMismatch(
            f"pool {path} was laid out for a different manifest ({len(problems)} field(s) differ)"
            + (f": {note}" if note else ""),
            why="\n".join(lines),
            fix=reinit_fix(path, manifest_changed=note is None),
        )
    return layout
