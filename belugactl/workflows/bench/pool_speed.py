"""The pool's own speed beside local DRAM (`belugactl bench pool`, issue 33 item 3): per memory device
and interleaved, the load latency of a dependent chase, the read bandwidth with each line invalidated
first, and the write bandwidth with non-temporal stores, at 1 to N threads.

The kernels are the native helper's (`_native_bench.c`). What they may touch is decided before the
pool is mapped (`decide_access`), and the mapping is made read-only unless writing is allowed:
- a pool a metadata server on this host serves (its lock is held): refused, unless `read_only`, and
  then only the shared KV area is read (the hashed chase writes nothing);
- a belugactl pool (a valid header) nobody serves here: writes only on the layout's unused tail
  (space no area uses), or with `read_only` the shared KV area's reads; a server on another host
  shares no lock with this one, so the KV area is never written;
- no header and a blank header area (a scratch file, a device never set up): everything after the
  2 MiB header area, which is left untouched so that setup still finds the device blank;
- no header and data in the header area: someone's data: reads only, with `read_only`.

A region is a range of the pool, or the chunks of it one memory device holds: with hardware
interleave (ways W, granularity G) device p holds G bytes of every W x G from position p; with
software interleave the devices lie end to end (`model/layout.py:Stripes`). DRAM is an anonymous
mapping (transparent huge pages asked for, as a dax device maps with 2 MiB pages).

Figures from the lab's emulated devices (or any guest) are the emulator's: `emulated` says so and
`compare` never judges them; a file pool is DRAM (or disk), not CXL, and is never judged either.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.dataplane import native
from belugactl.errors import EnvironmentProblem, UsageError
from belugactl.model.layout import FORMAT_VERSION
from belugactl.units import format_size

LINE = 64
MiB = 1 << 20
GiB = 1 << 30
HEADER_AREA = 2 * MiB  # the header's region at offset 0 (pool/header.py), never written here
MIN_REGION = 64 * 1024  # a region smaller than this measures caches and set-up, not the device
CHASE_MAX = 64 * MiB  # the chase's range per region (each line once: steps <= lines)
CHASE_STEPS = 200_000
DEFAULT_SIZE = 64 * MiB
LATENCY_CHASE = "pointer chase (one pointer written in every line of the range, then followed)"
LATENCY_HASHED = "hashed chase (read only: each address computed from the value the last load returned)"


@dataclass(frozen=True)
class Region:
    """`length` bytes from `offset`; with `stride`, only the first `chunk` bytes of every `stride`."""

    name: str
    offset: int
    length: int
    chunk: int = 0
    stride: int = 0

    @property
    def touched(self) -> int:
        return self.length // self.stride * self.chunk if self.stride else self.length

    def kernel_args(self) -> tuple[int, int]:
        return (self.chunk, self.stride) if self.stride else (0, 0)


@dataclass(frozen=True)
class Access:
    """What the bench may do to the pool: write or only read, and the byte range it may touch."""

    writable: bool
    offset: int
    length: int
    area: str  # what the range is, for the output ("the layout's unused tail", ...)


@dataclass(frozen=True)
class PoolState:
    """The pool as found before the bench maps it."""

    path: str
    kind: str  # "devdax" | "file"
    size: int
    served: bool  # a process on this host holds the pool's lock (a metadata server)
    header: Any = None  # belugactl.pool.header.PoolHeader when the pool has a valid one
    occupied: str | None = None  # no header, but the header area holds data: what is there


@dataclass(frozen=True)
class Interleave:
    mode: str  # "hardware" | "software" | "one device" | "unknown" (no manifest) | "file"
    ways: int = 1
    granularity: int = 0
    device_size: int = 0  # software: the bytes of each device, end to end
    base: int = 0  # hardware: the dax device's byte 0 in its region (positions count from the region)
    memdevs: tuple[str, ...] = ()  # in position order, where the region says (sysfs)
    source: str = "manifest"  # "manifest" | "sysfs <region>" | "none"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "ways": self.ways, "granularity": self.granularity or None, "base": self.base,
                "memdevs": list(self.memdevs), "source": self.source}  # fmt: skip

    def memdev(self, position: int) -> str | None:
        return self.memdevs[position] if position < len(self.memdevs) else None


def _kernels() -> Any:  # noqa: ANN401 - the C module
    mod = native._native
    if mod is None or not hasattr(mod, "bench_chase"):
        raise EnvironmentProblem(f"bench pool needs the native helper: {native.MISSING_WHY}", fix=native.MISSING_FIX)
    return mod


# --- what may be touched --------------------------------------------------------------------


def _is_devdax(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _devdax_size(path: str) -> int | None:
    name = os.path.basename(path)
    try:
        return int(Path(f"/sys/bus/dax/devices/{name}/size").read_text().strip())
    except (OSError, ValueError):
        return None


def _map(fd: int, length: int, prot: int, *, devdax: bool) -> mmap.mmap:
    """A shared mapping of `length` bytes; a devdax device with a 1 GiB alignment refuses a length
    that is not a multiple of it (EINVAL), so such a length is rounded up to 1 GiB once."""
    try:
        return mmap.mmap(fd, length, mmap.MAP_SHARED, prot)
    except OSError as exc:
        if not devdax or exc.errno != errno.EINVAL:
            raise
        return mmap.mmap(fd, -(-length // GiB) * GiB, mmap.MAP_SHARED, prot)


def served_here(path: str) -> bool:
    """True when a process on this host holds the pool's lock (pool/lock.py: a metadata server, or
    setup's claim): a shared lock cannot be had then."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


def inspect_pool(path: str) -> PoolState:
    """The pool's kind, size, header and lock, read without writing a byte."""
    from belugactl.errors import InputError
    from belugactl.pool.header import MAX_HEADER_SIZE, PoolHeader, occupied_reason

    if not os.path.exists(path):
        raise UsageError(
            f"--pool {path}: no such device or file",
            fix="name the pool's dax device (/dev/daxX.Y), or a scratch file: truncate -s 1G /tmp/scratch.pool",
        )
    devdax = _is_devdax(path)
    if not devdax and not os.path.isfile(path):
        raise UsageError(f"--pool {path}: neither a dax device nor a regular file")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot open {path}: {exc.strerror}", fix=f"run as a user who may read {path} (the pool's group, or root)"
        ) from None
    try:
        size = (_devdax_size(path) or 0) if devdax else os.fstat(fd).st_size
        window = min(size or HEADER_AREA, HEADER_AREA)
        mm = _map(fd, window, mmap.PROT_READ, devdax=devdax)
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"cannot map {path}", why=str(exc)) from None
    finally:
        os.close(fd)
    try:
        area = bytes(mm[:window])
    finally:
        mm.close()
    header = None
    occupied = None
    try:
        header = PoolHeader.unpack(area[:MAX_HEADER_SIZE])
        size = size or header.pool_size
    except InputError:
        occupied = occupied_reason(area)
    if size < 2 * HEADER_AREA:
        raise UsageError(
            f"--pool {path}: {format_size(size)} is too small to measure (at least {format_size(2 * HEADER_AREA)})",
            why="the size of a dax device is read from /sys/bus/dax, a file's from the file" if not size else None,
        )
    return PoolState(path, "devdax" if devdax else "file", size, served_here(path), header, occupied)


def _used_end(header: Any) -> int:
    """Where the layout's last used byte ends (header, metadata, journal, shared KV, partitions)."""
    geo = header.geometry
    ends = [geo.shared_kv_offset + geo.shared_kv_size, geo.journal_offset + geo.journal_size]
    ends += [h.offset + h.size for h in header.hosts]
    return max(ends)


def decide_access(state: PoolState, *, read_only: bool) -> Access:
    """What the bench may touch, by the rules in the module's docstring; UsageError (exit 2) when
    the pool cannot be measured as asked, with the way that can."""
    ro_fix = "pass --read-only to measure reads of the shared KV area only (nothing is written)"
    if state.header is not None:
        geo = state.header.geometry
        kv = Access(False, geo.shared_kv_offset, geo.shared_kv_size, "the shared KV area (read only)")
        if read_only:
            return kv
        if state.served:
            raise UsageError(
                f"{state.path} is in use: a process on this host holds the pool's lock (a metadata server)",
                why="bench pool writes the ranges it measures; a live pool is never written",
                fix=ro_fix,
            )
        if state.header.format_version != FORMAT_VERSION:
            raise UsageError(
                f"{state.path} is laid out with a capacity (header format {state.header.format_version}): its free "
                "partition slots are kept for hosts that join later, and the header lists only the slots in use",
                why="bench pool writes the ranges it measures; it cannot tell a free slot from an unused tail",
                fix=f"{ro_fix}; or measure writes on a blank device or a scratch file (truncate -s 1G FILE)",
            )
        start = -(-_used_end(state.header) // HEADER_AREA) * HEADER_AREA
        tail = state.size - start
        if tail >= 2 * MiB:
            return Access(True, start, tail, "the layout's unused tail (scratch: no area uses it)")
        raise UsageError(
            f"{state.path} is a belugactl pool with no unused space to write (its layout uses all "
            f"{format_size(state.size)})",
            why="its areas may hold another host's data (a server elsewhere shares no lock with this host)",
            fix=f"{ro_fix}; or measure writes on a blank device or a scratch file (truncate -s 1G FILE)",
        )
    if state.occupied is not None:
        if read_only:
            return Access(False, 0, state.size, "the whole device (read only: it holds data that is not a pool)")
        raise UsageError(
            f"{state.path} is not a belugactl pool but holds data: {state.occupied}",
            why="bench pool writes the ranges it measures and would destroy that data",
            fix="pass --read-only to measure reads only, or use a blank device or a scratch file",
        )
    if state.served:
        raise UsageError(f"{state.path} is locked by another process on this host", fix=ro_fix)
    return Access(
        not read_only,
        HEADER_AREA,
        state.size - HEADER_AREA,
        "blank (no header): everything after the 2 MiB header area" + (" (read only)" if read_only else ""),
    )


# --- the regions ----------------------------------------------------------------------------


def sysfs_interleave(path: str, root: str = "/") -> Interleave | None:
    """The CXL region that holds the dax device, from sysfs (no command run): its ways, granularity,
    memdevs in position order, and where the dax device starts in it. None when no region says
    (a firmware-provisioned range, a file, a kernel without the CXL bus)."""
    from belugactl.host.host import Host
    from belugactl.host.read_cxl import read_cxl_sysfs

    host = Host(root)
    start = host.read_int(f"/sys/bus/dax/devices/{os.path.basename(path)}/resource")
    if start is None:
        return None
    for region in read_cxl_sysfs(host).regions:
        if region.resource is None or not region.size or not region.resource <= start < region.resource + region.size:
            continue
        ways = region.interleave_ways or 1
        mode = "hardware" if ways > 1 else "one device"
        return Interleave(mode, ways, region.interleave_granularity or 0, base=start - region.resource,
                          memdevs=tuple(region.memdevs), source=f"sysfs {region.name}")  # fmt: skip
    return None


def interleave_of(manifest: Any | None, found: Interleave | None = None) -> Interleave:
    """Software interleave from the manifest (no region describes it); otherwise the region sysfs
    found (`found`: what this host decodes), else the manifest's hardware interleave."""
    il = manifest.pool.interleave if manifest is not None else None
    if il is not None and il.mode == "software" and il.ways > 1:
        gran = il.granularity if il.granularity is not None else manifest.pool.align
        return Interleave("software", il.ways, gran, manifest.pool.size // il.ways)
    if found is not None and (found.mode != "hardware" or found.granularity):
        return found
    if il is None:
        return Interleave("unknown", source="none")
    if il.mode == "hardware" and il.ways > 1:
        return Interleave("hardware", il.ways, il.granularity or 4096)  # the kernel's default granularity
    return Interleave("one device")


def _down(x: int, unit: int) -> int:
    return x // unit * unit


def plan_regions(access: Access, il: Interleave, size: int) -> tuple[list[Region], list[str]]:
    """The regions to measure inside `access`, each touching at most `size` bytes, and notes."""
    notes: list[str] = []
    lo, hi = access.offset, access.offset + access.length
    if il.mode == "hardware":
        stride = il.ways * il.granularity
        start = lo + (-(lo + il.base)) % stride  # the first interleave set in range: position 0 there
        span = _down(min(hi - start, size * il.ways), stride)
        if span < stride or span // il.ways < MIN_REGION:
            raise UsageError(f"the range the bench may touch ({format_size(access.length)}) is too small")
        regions = [
            Region(f"position {p}", start + p * il.granularity, span - p * il.granularity, il.granularity, stride)
            for p in range(il.ways)
        ]
        # every position's span must be a multiple of the stride: drop the last stride's tail
        regions = [Region(r.name, r.offset, _down(r.length, stride), r.chunk, stride) for r in regions]
        regions = [r for r in regions if r.length >= stride]
        regions.append(Region("interleaved", start, _down(min(span, size), 4096)))
        where = (
            f"{il.source}: the dax device starts {il.base} B into the region"
            + (f", memdevs by position {', '.join(il.memdevs)}" if il.memdevs else "")
            if il.source.startswith("sysfs")
            else "the manifest's (no region in sysfs: assumes the dax device starts on an interleave set)"
        )
        notes.append(
            f"hardware interleave, {il.ways} ways of {il.granularity} B: position p is every {il.ways}th "
            f"{il.granularity} B chunk from p; {where}"
        )
        return regions, notes
    if il.mode == "software":
        ds = il.device_size
        # the same offset within every device the range covers, so the interleaved row strides over them
        devices = [k for k in range(il.ways) if k * ds < hi and (k + 1) * ds > lo]
        inner = max(max(lo - k * ds, 0) for k in devices)
        length = _down(min(min(min(hi, (k + 1) * ds) - (k * ds + inner) for k in devices), size), 4096)
        if length < MIN_REGION:
            raise UsageError(f"the range the bench may touch ({format_size(access.length)}) is too small")
        regions = [Region(f"device {k}", k * ds + inner, length) for k in devices]
        if len(devices) > 1:
            each = _down(length // len(devices), 4096)
            regions.append(Region("interleaved", devices[0] * ds + inner, len(devices) * ds, each, ds))
        if len(devices) < il.ways:
            notes.append(
                f"software interleave over {il.ways} devices: only device(s) {', '.join(map(str, devices))} "
                f"lie in {access.area}"
            )
        return regions, notes
    length = _down(min(access.length, size), 4096)
    if length < MIN_REGION:
        raise UsageError(f"the range the bench may touch ({format_size(access.length)}) is too small")
    if il.mode == "unknown":
        notes.append("no manifest: the pool is measured as one device (pass -f rack.yaml for its interleave)")
    return [Region("device 0", lo, length)], notes


# --- measuring ------------------------------------------------------------------------------


def _slices(region: Region, threads: int) -> list[Region]:
    """`threads` pieces of the region, one per thread: whole strides when there are enough, else
    the same piece of every chunk."""
    if region.stride:
        count = region.length // region.stride
        if count >= threads:
            each = count // threads * region.stride
            return [
                Region(region.name, region.offset + i * each, each, region.chunk, region.stride) for i in range(threads)
            ]
        sub = _down(region.chunk // threads, LINE)
        if sub < LINE:
            raise ValueError(f"region {region.name} is too small for {threads} threads")
        return [Region(region.name, region.offset + i * sub, region.length, sub, region.stride) for i in range(threads)]
    each = _down(region.length // threads, 4096)
    if each < 2 * 4096:
        raise ValueError(f"region {region.name} ({region.length} bytes) is too small for {threads} threads")
    return [Region(region.name, region.offset + i * each, each) for i in range(threads)]


def _chase_range(region: Region) -> Region:
    """The region's first CHASE_MAX bytes touched (whole strides), where the chase runs."""
    if region.stride:
        count = min(region.length // region.stride, max(1, CHASE_MAX // region.chunk))
        return Region(region.name, region.offset, count * region.stride, region.chunk, region.stride)
    return Region(region.name, region.offset, _down(min(region.length, CHASE_MAX), LINE))


def latency(buf: Any, region: Region, *, writable: bool, repeat: int = 3, steps: int = CHASE_STEPS) -> float:
    """ns per dependent load, the median of `repeat` chases, each line of the range at most once."""
    k = _kernels()
    if region.offset % LINE:
        raise ValueError(f"region {region.name} starts at {region.offset}, not on a cache line")
    c = _chase_range(region)
    lines = c.touched // LINE
    steps = max(1, min(steps, lines if writable else 1 << (lines.bit_length() - 1)))
    chunk, stride = c.kernel_args()
    runs = [k.bench_chase(buf, c.offset, c.length, steps, 7 + i, chunk, stride, not writable) for i in range(repeat)]
    if writable:  # leave zeros, not pointers, behind
        k.bench_write_nt(buf, c.offset, c.length, chunk, stride)
    return statistics.median(runs)


def bandwidth(buf: Any, region: Region, threads: int, *, writable: bool, repeat: int = 3) -> dict[str, Any]:
    """GB/s (10^9 bytes) of `threads` threads side by side (the slowest thread's time, best of
    `repeat`): invalidated reads, and with `writable` non-temporal writes of zeros."""
    k = _kernels()
    slices = _slices(region, threads)
    total = sum(s.touched for s in slices)

    def read(s: Region) -> int:
        return k.bench_read(buf, s.offset, s.length, True, *s.kernel_args())

    def write(s: Region) -> int:
        return k.bench_write_nt(buf, s.offset, s.length, *s.kernel_args())

    out: dict[str, Any] = {"bytes": total, "read_gb_per_s": None, "write_nt_gb_per_s": None}
    with ThreadPoolExecutor(threads) as pool:
        if writable:
            write_ns = min(max(pool.map(write, slices)) for _ in range(repeat))
            out["write_nt_gb_per_s"] = round(total / max(write_ns, 1), 2)
        read_ns = min(max(pool.map(read, slices)) for _ in range(repeat))
        out["read_gb_per_s"] = round(total / max(read_ns, 1), 2)
    return out


def measure(buf: Any, region: Region, threads: int, *, writable: bool = True, repeat: int = 3) -> dict[str, Any]:
    """One region at one thread count: its latency and its bandwidths."""
    row: dict[str, Any] = {"region": region.name, "threads": threads}
    row["load_latency_ns"] = round(latency(buf, region, writable=writable, repeat=repeat), 1)
    row.update(bandwidth(buf, region, threads, writable=writable, repeat=repeat))
    return row


def run(
    buf: Any,
    regions: list[Region],
    *,
    threads: list[int],
    dram_bytes: int,
    emulated: bool,
    writable: bool = True,
    repeat: int = 3,
) -> dict[str, Any]:
    """Every region at every thread count, and local DRAM (an anonymous mapping, `dram_bytes`) the
    same way (the same kernels: with a read-only pool DRAM too is measured reads only). Latency is
    measured once per region (it is one thread's); each pool row has its ratios to DRAM's row."""
    dram = mmap.mmap(-1, dram_bytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            dram.madvise(mmap.MADV_HUGEPAGE)
    dram_region = Region("dram", 0, _down(dram_bytes, 4096))
    k = _kernels()
    k.bench_write_nt(dram, 0, dram_region.length)  # real pages, not the shared zero page a read would map
    rows: list[dict[str, Any]] = []
    lat: dict[str, float] = {}
    try:
        dram_view = dram if writable else memoryview(dram).toreadonly()
        for t in threads:
            for target, r in [(dram_view, dram_region)] + [(buf, r) for r in regions]:
                if r.name not in lat:
                    k.bench_read(target, r.offset, r.length, False, *r.kernel_args())  # fault every page in first
                    lat[r.name] = round(latency(target, r, writable=writable, repeat=repeat), 1)
                row = {"region": r.name, "threads": t, "load_latency_ns": lat[r.name]}
                row.update(bandwidth(target, r, t, writable=writable, repeat=repeat))
                rows.append(row)
    finally:
        if not writable:
            dram_view.release()
        dram.close()
    for row in rows:
        if row["region"] != "dram":
            base = next(r for r in rows if r["region"] == "dram" and r["threads"] == row["threads"])
            row["vs_dram"] = ratios(row, base)
    return {"emulated": emulated, "threads": threads, "rows": rows}


def ratios(row: dict[str, Any], dram: dict[str, Any]) -> dict[str, float | None]:
    """pool / DRAM for each figure (latency: > 1 is slower; bandwidth: < 1 is slower)."""
    out: dict[str, float | None] = {}
    for key, name in (("load_latency_ns", "load_latency"), ("read_gb_per_s", "read"), ("write_nt_gb_per_s", "write")):
        a, b = row.get(key), dram.get(key)
        out[name] = round(a / b, 2) if a and b else None
    return out


# --- emulation ------------------------------------------------------------------------------


def emulation(root: str = "/") -> str | None:
    """Why this machine's figures are an emulator's (a virtual machine), or None on bare metal."""
    base = Path(root)
    try:
        vendor = (base / "sys/class/dmi/id/sys_vendor").read_text().strip()
    except OSError:
        vendor = ""
    if "QEMU" in vendor.upper():
        return f"a QEMU guest (DMI sys_vendor {vendor!r}): the devices and their figures are QEMU's"
    try:
        cpuinfo = (base / "proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and " hypervisor" in line:
            return "a virtual machine (the CPU's hypervisor flag): its memory devices are the hypervisor's"
    return None


# --- the whole command ----------------------------------------------------------------------


@dataclass
class BenchPlan:
    state: PoolState
    access: Access
    interleave: Interleave
    regions: list[Region]
    notes: list[str] = field(default_factory=list)


def plan(path: str, manifest: Any | None, *, size: int, read_only: bool, root: str = "/") -> BenchPlan:
    state = inspect_pool(path)
    access = decide_access(state, read_only=read_only)
    if state.kind == "file":
        il = Interleave("file", source="none")  # a file has no memory devices
    else:
        il = interleave_of(manifest, sysfs_interleave(path, root))
    regions, notes = plan_regions(access, il, size)
    return BenchPlan(state, access, il, regions, notes)


def bench_pool(
    path: str,
    *,
    manifest: Any | None = None,
    threads: list[int],
    size: int = DEFAULT_SIZE,
    read_only: bool = False,
    repeat: int = 3,
    root: str = "/",
) -> dict[str, Any]:
    """`belugactl bench pool`: plan, map (read-only unless writing is allowed), measure, and say what
    was measured where. The pool's lock is held shared while it runs, so no server starts on this
    host under a write test."""
    p = plan(path, manifest, size=size, read_only=read_only, root=root)
    writable = p.access.writable
    emulated_why = emulation(root) if p.state.kind == "devdax" else None
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        if writable:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when fd closes
        end = max(r.offset + r.length for r in p.regions)
        length = -(-end // HEADER_AREA) * HEADER_AREA
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        devdax = p.state.kind == "devdax"
        mm = _map(fd, length if devdax else min(length, p.state.size), prot, devdax=devdax)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot map {path} {'read-write' if writable else 'read-only'}", why=str(exc),
            fix="run as a user with access to the pool, or pass --read-only",
        ) from None  # fmt: skip
    finally:
        os.close(fd)
    try:
        buf = mm if writable else memoryview(mm).toreadonly()
        doc = run(buf, p.regions, threads=threads, dram_bytes=max(r.touched for r in p.regions),
                  emulated=emulated_why is not None, writable=writable, repeat=repeat)  # fmt: skip
        if not writable:
            buf.release()
    finally:
        mm.close()
    notes = list(p.notes)
    if not writable:
        notes.append("read only: write bandwidth not measured (nothing was written)")
    if p.state.kind == "file":
        notes.append("a file pool is page cache (DRAM or disk), not CXL: its figures say nothing about a device")
    doc.update(
        pool={
            "path": path,
            "kind": p.state.kind,
            "size": p.state.size,
            "emulated": emulated_why is not None,
            "emulated_why": emulated_why,
            "access": {
                "mode": "read-write" if writable else "read-only",
                "offset": p.access.offset,
                "length": p.access.length,
                "area": p.access.area,
            },  # fmt: skip
        },
        interleave=p.interleave.to_dict(),
        size=size,
        latency_method=LATENCY_CHASE if writable else LATENCY_HASHED,
        regions=[
            {
                "name": r.name,
                "offset": r.offset,
                "length": r.length,
                "bytes": r.touched,
                "chunk": r.chunk or None,
                "stride": r.stride or None,
                "memdev": _memdev_of(r.name, p.interleave),
            }
            for r in p.regions
        ],  # fmt: skip
        notes=notes,
    )
    return doc


def _memdev_of(name: str, il: Interleave) -> str | None:
    """The memdev behind a region row, where the region's positions name one."""
    kind, _, number = name.partition(" ")
    if kind in ("position", "device") and number.isdigit():
        return il.memdev(int(number))
    return None


# --- expectations ---------------------------------------------------------------------------

# (manifest field, row field, higher is better)
EXPECTED = (
    ("load_latency_ns", "load_latency_ns", False),
    ("read_gbps_per_device", "read_gb_per_s", True),
    ("write_gbps_per_device", "write_nt_gb_per_s", True),
)
FIGURE_NAMES = {
    "load_latency_ns": "load latency",
    "read_gbps_per_device": "read bandwidth per device",
    "write_gbps_per_device": "write bandwidth per device",
}


@dataclass(frozen=True)
class Verdict:
    figure: str  # the manifest field: load_latency_ns | read_gbps_per_device | write_gbps_per_device
    status: str  # ok | warn | skip
    reason: str
    measured: float | None = None
    expected: float | None = None
    device: str | None = None  # the region the measured figure comes from

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "status": self.status, "reason": self.reason, "measured": self.measured,
                "expected": self.expected, "device": self.device}  # fmt: skip


def device_figure(doc: dict[str, Any], row_key: str, higher_better: bool) -> tuple[float, str] | None:
    """The worst device's figure: for bandwidth each device's best over the thread counts (what it
    can sustain), then the lowest of those; for latency the highest. None when nothing measured it."""
    best: dict[str, float] = {}
    for row in doc.get("rows", []):
        name, value = row.get("region"), row.get(row_key)
        if name in ("dram", "interleaved") or value is None:
            continue
        best[name] = max(best.get(name, value), value) if higher_better else min(best.get(name, value), value)
    if not best:
        return None
    pick = min(best, key=best.__getitem__) if higher_better else max(best, key=best.__getitem__)
    return best[pick], pick


def compare(doc: dict[str, Any], expect: Any | None) -> list[Verdict]:
    """Each expected figure against the measured one: ok, warn (worse by more than the margin), or
    skip (no expectation, not measured, emulated or a file)."""
    pool = doc.get("pool", {})
    out: list[Verdict] = []
    for field_name, row_key, higher in EXPECTED:
        want = getattr(expect, field_name, None) if expect is not None else None
        what = FIGURE_NAMES[field_name]
        if want is None:
            out.append(Verdict(field_name, "skip", f"no expectation (pool.expect.{field_name} unset)"))
            continue
        if pool.get("emulated"):
            out.append(Verdict(field_name, "skip", f"emulated device: {what} is the emulator's, not compared",
                               expected=want))  # fmt: skip
            continue
        if pool.get("kind") == "file":
            out.append(Verdict(field_name, "skip", f"a file pool is not a CXL device: {what} not compared",
                               expected=want))  # fmt: skip
            continue
        got = device_figure(doc, row_key, higher)
        if got is None:
            why = (
                "not measured: read only, nothing written (`belugactl bench pool` writes on scratch space)"
                if row_key == "write_nt_gb_per_s"
                else "not measured"
            )
            out.append(Verdict(field_name, "skip", f"{what} {why}", expected=want))
            continue
        value, device = got
        margin = float(getattr(expect, "margin_percent", 25.0)) / 100
        unit = "ns" if not higher else "GB/s"
        worse = value < want * (1 - margin) if higher else value > want * (1 + margin)
        text = f"{what} {value:g} {unit} ({device}) against {want:g} {unit} expected (margin {margin:.0%})"
        out.append(Verdict(field_name, "warn" if worse else "ok", text, value, want, device))
    return out


PERF_FIX = (
    "compare with `belugactl bench pool` beside DRAM; check that the pool is the CXL device (not a file "
    "or another node's memory), the memory devices' link width and speed (`lspci -vv`, LnkSta), their "
    "health (`cxl list -M -H`) and interleave (`cxl list -R`), and that the CPU is not throttled; if the "
    "figures are right for this hardware, lower pool.expect in the manifest"
)

MeasureFn = Callable[..., dict[str, Any]]
