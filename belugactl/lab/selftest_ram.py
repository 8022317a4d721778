"""`lab selftest` on a ram-profile lab: an interleaved ram region, shared by every guest, checked byte by byte.

In every guest in parallel: when the guest has no CXL region yet, `ramregion.provision` makes one (every
memdev, targets ordered by serial, then devdax); when it already has one (after `belugactl setup`), that
region and its dax device are used as they are and never torn down. Then every guest reads its region's
geometry back from the kernel (`cxl list -R -T`, `cxl list -M`, `daxctl list`) and all must agree: size,
ways, granularity and the serial at every interleave position.

The interleave check: each guest in turn writes a random pattern through its /dev/daxN.M at one offset
inside every interleave chunk of two consecutive stripes plus one far out, every other guest reads each
back through its own device, and the host finds each pattern in the backing file that
`ramregion.backing_position` names (file i is the device with the i-th smallest serial). The writer read
the bytes first and writes them back afterwards, and the host checks the files hold them again.

Where the selftest made the region, its probes sit at the start of the device (dax offset 0 is region
offset 0). Where the region pre-existed, `setup` has a pool header at offset 0 and data in the pool, so
every probe sits inside the last 2 MiB of the device, and the original bytes are restored either way.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from belugactl.errors import BelugaError, EnvironmentProblem, StepFailed
from belugactl.lab import emulated_rack, ramregion
from belugactl.lab.selftest_steps import Check, SelftestReport, Step, StepGuest, daxpoke_argv

PATTERN_BYTES = 16
# Inside each chunk, past its first bytes, so the detail reads `dax 0x1008 -> pool-1.raw@0x8`.
PROBE_SKEW = 8
# Where a region pre-existed, probes stay inside the device's last 2 MiB (see the module docstring).
TAIL_WINDOW = 2 * 1024 * 1024
# One daxpoke call moves at most this many bytes (as hex on argv: the kernel caps one argument at 128 KiB).
MAX_SPAN = 32 * 1024


@dataclass(frozen=True)
class Target:
    position: int
    memdev: str  # probe order, differs between boots and hosts
    serial: int  # the device's own identity


@dataclass
class GuestRegion:
    """One guest's ram region and dax device, as its kernel reports them."""

    guest: str
    region: str
    size: int
    ways: int
    granularity: int
    targets: list[Target]  # in position order
    dax: str
    dax_size: int
    dax_mode: str
    created: bool  # made by this selftest (and so torn down by it, unless --keep)

    def geometry(self) -> tuple[int, int, int, tuple[int, ...]]:
        """What must be equal on every guest: size, ways, granularity, serial at each position."""
        return (self.size, self.ways, self.granularity, tuple(t.serial for t in self.targets))


@dataclass(frozen=True)
class Probe:
    offset: int  # dax offset
    position: int  # interleave position it lands on
    file_index: int  # which backing file (device with the file_index-th smallest serial)
    file_offset: int


@dataclass
class RamSelftestReport(SelftestReport):
    """The pmem report's shape (lab, ok, checks, steps, cleaned_up, seconds, error) plus the regions."""

    profile: str = "ram"
    regions: list[GuestRegion] = field(default_factory=list)
    backing: list[str] = field(default_factory=list)
    probes_at: str = ""  # "start" (region made here) or "last 2 MiB" (region pre-existed)


# --- pure parts ------------------------------------------------------------------------------


def _as_list(doc: object) -> list[dict]:
    """The objects of a listing: one object alone, or an array of them (what one kind per listing prints)."""
    if isinstance(doc, dict):
        return [doc]
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def _int(value: object) -> int:
    return int(value, 0) if isinstance(value, str) else int(value)  # type: ignore[call-overload]


def parse_region(guest: str, regions: object, memdevs: object, daxes: object, *, created: bool) -> GuestRegion:
    """A GuestRegion from `cxl list -R -T`, `cxl list -M` and `daxctl list` documents (already parsed)."""
    regs = _as_list(regions)
    if len(regs) != 1:
        raise StepFailed(
            f"selftest: {guest} has {len(regs)} CXL regions, expected one",
            why=", ".join(str(r.get("region")) for r in regs) or "`cxl list -R` lists none",
            fix="the ram selftest uses the one region `belugactl setup` makes; destroy the others "
                "(cxl destroy-region -f REGION) or start fresh guests (lab down && lab up)",
        )  # fmt: skip
    reg = regs[0]
    serials = {str(m["memdev"]): _int(m["serial"]) for m in _as_list(memdevs) if "memdev" in m and "serial" in m}
    mappings = sorted((m for m in reg.get("mappings", []) if isinstance(m, dict)), key=lambda m: _int(m["position"]))
    missing = [str(m.get("memdev")) for m in mappings if str(m.get("memdev")) not in serials]
    if not mappings or missing:
        raise StepFailed(
            f"selftest: cannot tell the devices of {guest}'s {reg.get('region')} by serial",
            why=f"mappings {mappings}, memdevs with a serial {sorted(serials)}",
            fix="cxl list -R -T and cxl list -M in the guest",
        )
    targets = [Target(_int(m["position"]), str(m["memdev"]), serials[str(m["memdev"])]) for m in mappings]
    devs = _as_list(daxes)
    if len(devs) != 1:
        raise StepFailed(
            f"selftest: {guest} shows {len(devs)} dax devices, expected the one of {reg.get('region')}",
            why=json.dumps(devs)[:300],
            fix="daxctl list in the guest",
        )
    dax = devs[0]
    if str(dax.get("mode")) != "devdax":
        raise StepFailed(
            f"selftest: {guest}'s {dax.get('chardev')} is in mode {dax.get('mode')!r}, not devdax",
            why="the pool must be a character device; as system-ram it is the host's memory, not shared",
            fix=f"belugactl doctor in {guest} (it names the recovery: daxctl reconfigure-device --mode=devdax)",
        )
    return GuestRegion(
        guest=guest,
        region=str(reg["region"]),
        size=_int(reg["size"]),
        ways=_int(reg["interleave_ways"]),
        granularity=_int(reg["interleave_granularity"]),
        targets=targets,
        dax=str(dax["chardev"]),
        dax_size=_int(dax["size"]),
        dax_mode=str(dax["mode"]),
        created=created,
    )


def geometry_check(regions: list[GuestRegion]) -> Check:
    """Every guest must see the same size, ways, granularity and serial at each position."""
    shapes = {r.geometry() for r in regions}
    return Check(
        "every guest's region has the same geometry (size, ways, granularity, serial at each position)",
        len(shapes) == 1 and bool(regions),
        "; ".join(f"{r.guest}: {describe_geometry(r)}" for r in regions),
    )


def describe_geometry(r: GuestRegion) -> str:
    targets = ", ".join(f"{t.position}:{t.memdev}={t.serial:#x}" for t in r.targets)
    return f"{r.size // (1024 * 1024)} MiB, {r.ways}-way, granularity {r.granularity}, positions [{targets}]"


def serial_order_check(regions: list[GuestRegion], backing: list[str]) -> Check:
    """One backing file per device: the region must span them all, or some file goes unchecked."""
    problems = [
        f"{r.guest}: {r.ways}-way region, {len(backing)} backing files" for r in regions if r.ways != len(backing)
    ]
    return Check(
        "every guest's region spans every device of the lab (one backing file per position)",
        not problems and bool(backing),
        "; ".join(problems) or f"{len(backing)} files: {', '.join(Path(b).name for b in backing)}",
    )


def choose_offsets(size: int, ways: int, granularity: int, *, tail: bool) -> list[int]:
    """One offset in every chunk of two consecutive stripes, plus one in the device's last chunk.

    tail=False: the stripes start at offset 0 (a region this selftest made holds nothing).
    tail=True: everything sits inside the last TAIL_WINDOW bytes, away from the pool header at 0
    and from data `setup` placed at the front of the pool.
    """
    if ways < 1 or granularity < PROBE_SKEW + PATTERN_BYTES or size < 2 * ways * granularity + granularity:
        raise StepFailed(
            f"selftest: a {ways}-way region of {size} bytes at granularity {granularity} is too small to probe",
            fix="lab up with a larger --pool-size",
        )
    stripe = ways * granularity
    base = 0
    if tail:
        window = min(TAIL_WINDOW, size)
        base = -(-(size - window) // stripe) * stripe  # the first whole stripe inside the window
        if base + 2 * stripe > size - granularity:
            raise StepFailed(
                f"selftest: two {stripe}-byte stripes do not fit inside the last {window} bytes of the device",
                why="a pre-existing region is probed only in its last 2 MiB, which nothing in the pool layout uses",
            )
    near = [base + c * granularity + PROBE_SKEW for c in range(2 * ways)]
    far = (size // granularity - 1) * granularity + PROBE_SKEW
    return near + ([far] if far not in near else [])


def file_index_by_position(targets: list[Target]) -> dict[int, int]:
    """Position -> backing file index: file i is the device with the i-th smallest serial."""
    ranked = sorted(t.serial for t in targets)
    return {t.position: ranked.index(t.serial) for t in targets}


def plan_probes(region: GuestRegion, offsets: list[int]) -> list[Probe]:
    files = file_index_by_position(region.targets)
    probes = []
    for off in offsets:
        position, file_off = ramregion.backing_position(off, region.ways, region.granularity)
        probes.append(Probe(off, position, files[position], file_off))
    return probes


def spans(offsets: Iterable[int], length: int, max_span: int = MAX_SPAN) -> list[tuple[int, int]]:
    """(start, size) ranges covering [off, off+length) for each offset, merged while under max_span."""
    out: list[tuple[int, int]] = []
    for off in sorted(offsets):
        if out and off + length - out[-1][0] <= max_span:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][1], off + length - start))
        else:
            out.append((off, length))
    return out


def render_lines(report: RamSelftestReport, *, keep: bool) -> list[str]:
    """The human report, in the pmem selftest's style."""
    lines = []
    for r in report.regions:
        targets = ", ".join(f"{t.memdev} ({t.serial:#x})" for t in r.targets)
        origin = "made by the selftest" if r.created else "pre-existing, used as is"
        lines.append(
            f"{r.guest}: {r.region} {r.size // (1024 * 1024)} MiB, {r.ways}-way, granularity {r.granularity}, "
            f"targets {targets} -> /dev/{r.dax} ({r.dax_mode}, {origin})"
        )
    if report.probes_at:
        lines.append(f"probes at the {report.probes_at} of the device; original bytes restored after each check")
    for c in report.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.what}: {c.detail}")
    created = [r for r in report.regions if r.created]
    if not created:
        cleanup = "none made (pre-existing regions left as they are)"
    elif report.cleaned_up:
        cleanup = "torn down"
    else:
        cleanup = "kept (--keep)" if keep else "cleanup FAILED"
    lines.append(f"regions made by the selftest: {cleanup}; {len(report.steps)} guest commands in {report.seconds} s")
    return lines


# --- against the lab -------------------------------------------------------------------------


def _read_region(g: StepGuest, *, created: bool) -> GuestRegion:
    return parse_region(
        g.name,
        g.json("list the region and its targets", ["cxl", "list", "-R", "-T"]),
        g.json("list memdevs and serials", ["cxl", "list", "-M"]),
        g.json("list dax devices", ["daxctl", "list"]),
        created=created,
    )


def _prepare(g: StepGuest, creating: set[str]) -> GuestRegion:
    if _as_list(g.json("list existing regions", ["cxl", "list", "-R"])):
        return _read_region(g, created=False)
    creating.add(g.name)  # from here on a region there is ours, even if provisioning fails half-way
    start = time.monotonic()
    try:
        made = ramregion.provision(g.channel)
    except BelugaError as exc:
        g.report.steps.append(_step(g.name, "create the ram region and make it devdax", False, start, exc.what))
        raise
    g.report.steps.append(_step(g.name, f"create {made.region} (ram, {made.ways}-way) and make {made.dax} devdax",
                                True, start, ""))  # fmt: skip
    return _read_region(g, created=True)


def _step(guest: str, what: str, ok: bool, start: float, detail: str) -> Step:
    return Step(guest, what, ["belugactl.lab.ramregion.provision"], ok, round(time.monotonic() - start, 3), detail)


def _peek(g: StepGuest, dax: str, start: int, size: int) -> bytes:
    out = g.run(f"read {size} bytes at {start:#x} of /dev/{dax}",
                [*daxpoke_argv(), "read", f"/dev/{dax}", hex(start), str(size)])  # fmt: skip
    return bytes.fromhex(out.strip())


def _poke(g: StepGuest, dax: str, start: int, data: bytes, what: str) -> None:
    g.run(f"{what}: {len(data)} bytes at {start:#x} of /dev/{dax}",
          [*daxpoke_argv(), "write", f"/dev/{dax}", hex(start), data.hex()])  # fmt: skip


def _file_bytes(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def _round(report: RamSelftestReport, writer: StepGuest, wr: GuestRegion, readers: list[tuple[StepGuest, GuestRegion]],
           probes: list[Probe], files: list[Path]) -> None:  # fmt: skip
    """Writer saves the bytes, writes patterns, readers read them, the host finds them; then restore."""
    ranges = spans([p.offset for p in probes], PATTERN_BYTES)
    original = {start: _peek(writer, wr.dax, start, size) for start, size in ranges}
    patterns = {p.offset: secrets.token_bytes(PATTERN_BYTES) for p in probes}

    def image(start: int, size: int) -> bytes:
        buf = bytearray(original[start])
        for off, pat in patterns.items():
            if start <= off < start + size:
                buf[off - start : off - start + PATTERN_BYTES] = pat
        return bytes(buf)

    try:
        for start, size in ranges:
            _poke(writer, wr.dax, start, image(start, size), "write the patterns")
        seen = {
            reader.name: {start: _peek(reader, rr.dax, start, size) for start, size in ranges}
            for reader, rr in readers
        }
        for p in probes:
            pat = patterns[p.offset]
            start = next(s for s, n in ranges if s <= p.offset < s + n)
            wrong = [
                f"{name} read {got[start][p.offset - start :][:PATTERN_BYTES].hex()}"
                for name, got in seen.items()
                if got[start][p.offset - start :][:PATTERN_BYTES] != pat
            ]
            in_file = _file_bytes(files[p.file_index], p.file_offset, PATTERN_BYTES)
            if in_file != pat:
                wrong.append(f"{files[p.file_index].name}@{p.file_offset:#x} holds {in_file.hex()}")
            where = f"dax {p.offset:#x} -> {files[p.file_index].name}@{p.file_offset:#x}"
            report.checks.append(Check(
                f"{writer.name} writes position {p.position}, {', '.join(seen) or 'nobody'} read it, the host finds it",
                not wrong,
                f"{where}: same bytes" if not wrong else f"{where}: wrote {pat.hex()}, " + "; ".join(wrong),
            ))  # fmt: skip
    finally:
        for start, _size in ranges:
            _poke(writer, wr.dax, start, original[start], "restore the original bytes")
    unrestored = [
        f"{files[p.file_index].name}@{p.file_offset:#x}"
        for p in probes
        if _file_bytes(files[p.file_index], p.file_offset, PATTERN_BYTES)
        != next(original[s][p.offset - s :][:PATTERN_BYTES] for s, n in ranges if s <= p.offset < s + n)
    ]
    report.checks.append(Check(
        f"{writer.name} put the original bytes back",
        not unrestored,
        f"{len(probes)} places hold their bytes from before" if not unrestored else "differs: " + ", ".join(unrestored),
    ))  # fmt: skip


def run(st: emulated_rack.LabStatus, *, keep: bool = False) -> RamSelftestReport:
    """The ram selftest on a lab that is up (`st` from emulated_rack.status). Raises only for an unusable lab."""
    start = time.monotonic()
    report = RamSelftestReport(st.name, backing=list(st.backing))
    if not st.backing:
        raise EnvironmentProblem(f"lab {st.name!r} (profile ram) records no backing files",
                                 fix="belugactl lab down && belugactl lab up --profile ram")  # fmt: skip
    files = [Path(b) for b in st.backing]
    guests = [StepGuest(g.name, emulated_rack.channel(st.name, g.name), report) for g in st.guests]
    regions: list[GuestRegion] = []
    creating: set[str] = set()
    try:
        with ThreadPoolExecutor(max_workers=len(guests)) as ex:
            futures = [ex.submit(_prepare, g, creating) for g in guests]
            # Every future is waited for, so a region made in one guest is known even if another fails.
            errors: list[BelugaError] = []
            for fut in futures:
                try:
                    regions.append(fut.result())
                except BelugaError as exc:
                    errors.append(exc)
        report.regions = regions
        if errors:
            raise errors[0]
        report.checks.append(geometry_check(regions))
        report.checks.append(serial_order_check(regions, st.backing))
        if all(c.ok for c in report.checks):
            tail = not all(r.created for r in regions)
            report.probes_at = "last 2 MiB" if tail else "start"
            first = regions[0]
            offsets = choose_offsets(min(r.dax_size for r in regions), first.ways, first.granularity, tail=tail)
            probes = plan_probes(first, offsets)
            for i, writer in enumerate(guests):
                readers = [(g, r) for j, (g, r) in enumerate(zip(guests, regions, strict=True)) if j != i]
                _round(report, writer, regions[i], readers, probes, files)
    except BelugaError as exc:
        report.error = exc.what + (f": {exc.why}" if exc.why else "")
    finally:
        if not keep:
            report.cleaned_up = _cleanup(report, guests, regions, creating)
        report.seconds = round(time.monotonic() - start, 2)
    report.ok = report.error is None and bool(report.checks) and all(c.ok for c in report.checks)
    return report


def _cleanup(report: RamSelftestReport, guests: list[StepGuest], regions: list[GuestRegion],
             creating: set[str]) -> bool:
    """Destroy only the regions this selftest made; a pre-existing region stays as it was."""
    ok = True
    known = {r.guest: r for r in regions}
    for g in guests:
        if g.name not in creating:
            continue  # its region (if any) pre-existed
        try:
            if g.name in known:
                names = [known[g.name].region]
            else:  # provisioning failed half-way: whatever region the guest now has is ours
                names = [str(r["region"]) for r in _as_list(g.json("list leftover regions", ["cxl", "list", "-R"]))]
            for name in names:
                g.run("destroy the region the selftest made", ["cxl", "destroy-region", "-f", name])
        except BelugaError as exc:
            ok = False
            report.error = report.error or f"cleanup: {exc.what}: {exc.why}"
    return ok
