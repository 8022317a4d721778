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

import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from belugactl.errors import BelugaError, StepFailed
from belugactl.lab import emulated_rack
from belugactl.lab.selftest_steps import Check, Provisioned, SelftestReport, StepGuest

NAMESPACE_NAME = "belugactl-selftest"
PATTERN_BYTES = 64


def _as_list(doc: object) -> list[dict]:
    if isinstance(doc, dict):
        return [doc]
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def _provision(g: StepGuest, ns_uuid: str) -> Provisioned:
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


def _teardown(g: StepGuest, p: Provisioned) -> None:
    g.run("destroy the namespace", ["ndctl", "destroy-namespace", "-f", p.namespace])
    g.run("destroy the region", ["cxl", "destroy-region", "-f", p.region])


def _file_bytes(pool: Path, offset: int, length: int) -> bytes:
    with open(pool, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def run(name: str = emulated_rack.DEFAULT_NAME, *, keep: bool = False) -> SelftestReport:
    """Run the selftest on lab `name`; the report says what passed. Raises only for a lab not up."""
    start = time.monotonic()
    report = SelftestReport(name, uuid=str(uuid.uuid4()))
    st = emulated_rack.status(name)
    if st.state != "up":
        from belugactl.errors import EnvironmentProblem

        raise EnvironmentProblem(f"lab {name!r} is {st.state}", fix="belugactl lab up (or lab status to see why)")
    if st.profile == "ram":  # ram regions, interleaved across devices: a module of its own
        from belugactl.lab import selftest_ram

        return selftest_ram.run(st, keep=keep)
    pool = Path(st.pool or "")
    guests = [StepGuest(g.name, emulated_rack.channel(name, g.name), report) for g in st.guests]
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


def _exchange(report: SelftestReport, guests: list[StepGuest], provisioned: list[Provisioned], pool: Path) -> None:
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


def _cleanup(report: SelftestReport, guests: list[StepGuest], provisioned: list[Provisioned]) -> bool:
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
