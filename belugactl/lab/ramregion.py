"""A ram region in a ram-profile guest, by hand with the real tools, and where its bytes land.

`provision` runs, in one guest: `cxl list -M` (memdevs and their serials), `cxl create-region -t ram`
across every memdev with the targets ordered by serial, then `daxctl reconfigure-device --mode=devdax`.
Targets go by serial because memdev names follow probe order, which differs between boots and hosts
(seen in this lab: mem0 was serial 0x10 on one guest and 0x11 on the other); a region built from names
puts the devices at different interleave positions on each host, which then disagree about every byte.

`backing_position` says where a dax offset lands for an N-way region at granularity G: in device
(offset // G) % N, at ((offset // G) // N) * G + offset % G. A ram region has no info block, so dax
offset 0 is region offset 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from belugactl.errors import StepFailed
from belugactl.lab.channel import GuestChannel

CMD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Memdev:
    name: str  # mem0: probe order, not stable
    serial: int  # stable: the device's own identity


@dataclass(frozen=True)
class RamRegion:
    guest: str
    region: str
    size: int
    ways: int
    granularity: int
    targets: tuple[Memdev, ...]  # in interleave position order
    positions: dict[int, str]  # position -> memdev, as the kernel reports it
    dax: str
    dax_mode: str
    seconds: float  # guest-side time of the whole sequence

    def to_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest, "region": self.region, "size": self.size, "ways": self.ways,
            "granularity": self.granularity, "targets": [[m.name, hex(m.serial)] for m in self.targets],
            "positions": self.positions, "dax": self.dax, "dax_mode": self.dax_mode, "seconds": self.seconds,
        }  # fmt: skip


def _serial(value: object) -> int:
    # Raw output carries integers; -u (human) output carries "0x10".
    return int(value, 0) if isinstance(value, str) else int(value)  # type: ignore[call-overload]


def parse_memdevs(text: str) -> list[Memdev]:
    """Memdevs from `cxl list -M` (a list of objects, or one object when there is a single memdev)."""
    data = json.loads(text) if text.strip() else []
    if isinstance(data, dict):
        data = [data]
    return [Memdev(str(d["memdev"]), _serial(d["serial"])) for d in data if "memdev" in d]


def by_serial(memdevs: list[Memdev]) -> list[Memdev]:
    serials = [m.serial for m in memdevs]
    if len(set(serials)) != len(serials):
        raise StepFailed("two CXL memdevs report the same serial", why=str(memdevs),
                         fix="give every device its own serial (QEMU: sn=)")
    return sorted(memdevs, key=lambda m: m.serial)


def backing_position(offset: int, ways: int, granularity: int) -> tuple[int, int]:
    """(interleave position, offset inside that device) of byte `offset` of an N-way region."""
    chunk, within = divmod(offset, granularity)
    return chunk % ways, (chunk // ways) * granularity + within


def _run(ch: GuestChannel, argv: list[str]) -> str:
    result = ch.run(argv, timeout=CMD_TIMEOUT_S)
    if result.returncode != 0:
        raise StepFailed(
            f"{ch.name}: `{' '.join(argv)}` exited {result.returncode}",
            why=(result.stderr or result.stdout).decode(errors="replace").strip()[-800:],
        )
    return result.stdout.decode(errors="replace")


def provision(ch: GuestChannel, *, decoder: str = "decoder0.0", granularity: int = 4096) -> RamRegion:
    """Create one ram region across every memdev of the guest (ordered by serial) and make it devdax."""
    memdevs = by_serial(parse_memdevs(_run(ch, ["cxl", "list", "-M"])))
    if not memdevs:
        raise StepFailed(f"{ch.name}: `cxl list -M` shows no memdev", fix="check the guest's console for cxl errors")
    argv = ["cxl", "create-region", "-t", "ram", "-d", decoder, "-w", str(len(memdevs)), "-g", str(granularity),
            "-m", *[m.name for m in memdevs]]  # fmt: skip
    start = _uptime(ch)
    region = json.loads(_run(ch, argv))
    name = str(region["region"])
    daxes = json.loads(_run(ch, ["daxctl", "list"]) or "[]")
    if isinstance(daxes, dict):
        daxes = [daxes]
    if len(daxes) != 1:
        raise StepFailed(f"{ch.name}: expected the one dax device of {name}, found {len(daxes)}",
                         why=json.dumps(daxes), fix="is dax_cxl loaded in the guest? start from a bare guest")
    dax = str(daxes[0]["chardev"])
    reconf = json.loads(_run(ch, ["daxctl", "reconfigure-device", "--mode=devdax", "-f", dax]))
    if isinstance(reconf, list):
        reconf = reconf[0]
    end = _uptime(ch)
    return RamRegion(
        guest=ch.name,
        region=name,
        size=int(region["size"]),
        ways=int(region["interleave_ways"]),
        granularity=int(region["interleave_granularity"]),
        targets=tuple(memdevs),
        positions={int(m["position"]): str(m["memdev"]) for m in region.get("mappings", [])},
        dax=dax,
        dax_mode=str(reconf.get("mode")),
        seconds=round(end - start, 2),
    )


def _uptime(ch: GuestChannel) -> float:
    return float(_run(ch, ["cat", "/proc/uptime"]).split()[0])
