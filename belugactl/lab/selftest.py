"""`lab selftest`: prove that the guests really share one pool, through the real CXL stack.

In every guest, by hand with the real tools: `cxl create-region` (pmem), then
`ndctl create-namespace -m devdax -M mem -a 2M` with one uuid and name for all guests. Then guest A
writes a random pattern through its /dev/daxX.Y, and the test looks for it in guest B's device and in
the pool's backing file at the offset the guest's own sysfs implies (dax start - region start + the
device's DPA base: 2 MiB with map=mem). Then the other way round. A topology that drops writes
(one root port under the host bridge on QEMU 7.2) fails here, loudly.

By default everything is torn down afterwards (patterns zeroed, namespace destroyed, region
destroyed), so `belugactl setup` can start from bare guests; `keep=True` leaves it in place.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from belugactl.errors import BelugaError, StepFailed
from belugactl.lab import rack
from belugactl.lab.channel import GuestChannel

NAMESPACE_NAME = "belugactl-selftest"
PATTERN_BYTES = 64
CMD_TIMEOUT_S = 120.0


@dataclass
class Step:
    guest: str
    what: str
    argv: list[str]
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Provisioned:
    guest: str
    region: str  # cxl region, e.g. region0
    nd_region: str  # nvdimm region, e.g. region0
    namespace: str  # e.g. namespace0.0
    dax: str  # e.g. dax0.0
    dax_size: int
    file_offset: int  # where byte 0 of the dax device sits in the pool's backing file


@dataclass
class Check:
    what: str
    ok: bool
    detail: str


@dataclass
class SelftestReport:
    lab: str
    ok: bool = False
    uuid: str = ""
    provisioned: list[Provisioned] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    cleaned_up: bool = False
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _Guest:
    def __init__(self, name: str, channel: GuestChannel, report: SelftestReport) -> None:
        self.name = name
        self.channel = channel
        self.report = report

    def run(self, what: str, argv: list[str], *, check: bool = True) -> str:
        start = time.monotonic()
        result = self.channel.run(argv, timeout=CMD_TIMEOUT_S)
        out = result.stdout.decode(errors="replace")
        err = result.stderr.decode(errors="replace").strip()
        ok = result.returncode == 0
        detail = "" if ok else f"exit {result.returncode}: {err.splitlines()[-1] if err else '(no stderr)'}"
        self.report.steps.append(Step(self.name, what, argv, ok, round(time.monotonic() - start, 3), detail))
        if check and not ok:
            raise StepFailed(
                f"selftest: {what} failed in {self.name}",
                why=f"`{' '.join(argv)}` {detail}",
                fix="belugactl lab status; rerun on fresh guests: belugactl lab down && belugactl lab up",
            )
        return out

    def json(self, what: str, argv: list[str]) -> object:
        out = self.run(what, argv)
        try:
            return json.loads(out) if out.strip() else []
        except ValueError as exc:
            raise StepFailed(f"selftest: {what} in {self.name} printed no JSON", why=out[:300]) from exc

    def read_int(self, path: str) -> int:
        return int(self.run(f"read {path}", ["cat", path]).strip(), 0)

    def poke(self, dax: str, offset: int, data: bytes) -> None:
        self.run(f"write {len(data)} bytes at {offset:#x} of /dev/{dax}", [*_daxpoke(), "write", f"/dev/{dax}",
                                                                           str(offset), data.hex()])

    def peek(self, dax: str, offset: int, length: int) -> bytes:
        out = self.run(f"read {length} bytes at {offset:#x} of /dev/{dax}",
                       [*_daxpoke(), "read", f"/dev/{dax}", str(offset), str(length)])
        return bytes.fromhex(out.strip())


def _daxpoke() -> list[str]:
    return [os.path.realpath(sys.executable), "-I", "-S", str(Path(__file__).with_name("daxpoke.py").resolve())]


def _as_list(doc: object) -> list[dict]:
    if isinstance(doc, dict):
        return [doc]
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def _provision(g: _Guest, ns_uuid: str) -> Provisioned:
    if _as_list(g.json("list existing regions", ["cxl", "list", "-R"])):
        raise StepFailed(
            f"selftest: {g.name} already has a CXL region",
            why="the selftest provisions by hand and needs bare guests",
            fix="belugactl lab down && belugactl lab up (or tear the region down in the guest)",
        )
    hostname = g.run("read the hostname", ["hostname"]).strip()
    if hostname != g.name:
        raise StepFailed(f"selftest: {g.name} calls itself {hostname!r}")
    memdevs = [m["memdev"] for m in _as_list(g.json("list memdevs", ["cxl", "list", "-M"])) if "memdev" in m]
    decoders = [
        d["decoder"]
        for d in _as_list(g.json("list root decoders", ["cxl", "list", "-D", "-d", "root"]))
        if d.get("pmem_capable")
    ]
    if not memdevs or not decoders:
        raise StepFailed(f"selftest: {g.name} shows no CXL memdev or no pmem-capable root decoder",
                         why=f"memdevs {memdevs}, root decoders {decoders}")
    region_doc = _as_list(g.json("create the CXL pmem region",
                                 ["cxl", "create-region", "-m", "-d", decoders[0], "-w", "1", "-t", "pmem",
                                  memdevs[0]]))[0]
    region = str(region_doc["region"])
    endpoint_decoder = str(region_doc["mappings"][0]["decoder"])
    nd_regions = [r for r in _as_list(g.json("list nvdimm regions", ["ndctl", "list", "-R"]))
                  if r.get("type") == "pmem" and int(r.get("available_size", 0)) > 0]
    if not nd_regions:
        raise StepFailed(f"selftest: {g.name} has no nvdimm region with free space after create-region")
    nd_region = str(nd_regions[0]["dev"])
    ns = _as_list(g.json("create the devdax namespace",
                         ["ndctl", "create-namespace", "-m", "devdax", "-M", "mem", "-r", nd_region, "-a", "2M",
                          "-u", ns_uuid, "-n", NAMESPACE_NAME]))[0]
    dev = ns["daxregion"]["devices"][0]
    dax = str(dev["chardev"])
    dax_start = g.read_int(f"/sys/bus/dax/devices/{dax}/resource")
    region_start = g.read_int(f"/sys/bus/nd/devices/{nd_region}/resource")
    dpa_base = g.read_int(f"/sys/bus/cxl/devices/{endpoint_decoder}/dpa_resource")
    return Provisioned(g.name, region, nd_region, str(ns["dev"]), dax, int(dev["size"]),
                       dax_start - region_start + dpa_base)


def _teardown(g: _Guest, p: Provisioned) -> None:
    g.run("destroy the namespace", ["ndctl", "destroy-namespace", "-f", p.namespace])
    g.run("destroy the region", ["cxl", "destroy-region", "-f", p.region])


def _file_bytes(pool: Path, offset: int, length: int) -> bytes:
    with open(pool, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def run(name: str = rack.DEFAULT_NAME, *, keep: bool = False) -> SelftestReport:
    """Run the selftest on lab `name`; the report says what passed. Raises only for a lab not up."""
    start = time.monotonic()
    report = SelftestReport(name, uuid=str(uuid.uuid4()))
    st = rack.status(name)
    if st.state != "up":
        from belugactl.errors import EnvironmentProblem

        raise EnvironmentProblem(f"lab {name!r} is {st.state}", fix="belugactl lab up (or lab status to see why)")
    if st.profile == "ram":  # ram regions, interleaved across devices: a module of its own
        from belugactl.lab import selftest_ram

        return selftest_ram.run(st, keep=keep)
    pool = Path(st.pool or "")
    guests = [_Guest(g.name, rack.channel(name, g.name), report) for g in st.guests]
    provisioned: list[Provisioned] = []
    try:
        with ThreadPoolExecutor(max_workers=len(guests)) as pool_exec:
            provisioned = list(pool_exec.map(lambda g: _provision(g, report.uuid), guests))
        report.provisioned = provisioned
        _exchange(report, guests, provisioned, pool)
    except BelugaError as exc:
        report.error = exc.what + (f": {exc.why}" if exc.why else "")
    finally:
        if not keep:
            report.cleaned_up = _cleanup(report, guests, provisioned)
        report.seconds = round(time.monotonic() - start, 2)
    report.ok = report.error is None and all(c.ok for c in report.checks) and bool(report.checks)
    return report


def _exchange(report: SelftestReport, guests: list[_Guest], provisioned: list[Provisioned], pool: Path) -> None:
    offsets = {p.file_offset for p in provisioned}
    report.checks.append(Check(
        "every guest's dax device starts at the same place in the pool file",
        len(offsets) == 1,
        ", ".join(f"{p.guest}: /dev/{p.dax} at {p.file_offset:#x}" for p in provisioned),
    ))
    size = min(p.dax_size for p in provisioned)
    # Each writer gets its own spot, away from offset 0 where a pool header will later live.
    for i, writer in enumerate(guests):
        wp = provisioned[i]
        offset = (size // 2 + i * 4 * 1024 * 1024 + secrets.randbelow(1024) * 64) % (size - PATTERN_BYTES)
        pattern = secrets.token_bytes(PATTERN_BYTES)
        writer.poke(wp.dax, offset, pattern)
        in_file = _file_bytes(pool, wp.file_offset + offset, PATTERN_BYTES)
        report.checks.append(Check(
            f"{writer.name}'s write is in the pool file at {wp.file_offset + offset:#x}",
            in_file == pattern,
            "found" if in_file == pattern else f"expected {pattern[:8].hex()}..., found {in_file[:8].hex()}...",
        ))
        for j, reader in enumerate(guests):
            if j == i:
                continue
            seen = reader.peek(provisioned[j].dax, offset, PATTERN_BYTES)
            report.checks.append(Check(
                f"{reader.name} reads {writer.name}'s write at /dev/{provisioned[j].dax}+{offset:#x}",
                seen == pattern,
                "same bytes" if seen == pattern else f"expected {pattern[:8].hex()}..., read {seen[:8].hex()}...",
            ))
        # Zeroed once checked, so a later `setup` finds clean media.
        writer.poke(wp.dax, offset, bytes(PATTERN_BYTES))


def _cleanup(report: SelftestReport, guests: list[_Guest], provisioned: list[Provisioned]) -> bool:
    ok = True
    by_name = {g.name: g for g in guests}
    for p in provisioned:
        try:
            _teardown(by_name[p.guest], p)
        except BelugaError as exc:
            ok = False
            report.error = report.error or f"cleanup: {exc.what}: {exc.why}"
    # A guest that failed half-way may hold a region that never made it into `provisioned`.
    done = {p.guest for p in provisioned}
    for g in guests:
        if g.name in done:
            continue
        try:
            g.run("destroy leftover namespaces", ["ndctl", "destroy-namespace", "-f", "all"], check=False)
            for r in _as_list(g.json("list leftover regions", ["cxl", "list", "-R"])):
                g.run("destroy a leftover region", ["cxl", "destroy-region", "-f", str(r["region"])])
        except BelugaError:
            ok = False
    return ok
