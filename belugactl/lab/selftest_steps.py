"""What both lab selftests record (steps, checks, the report) and the guest that runs and records each step.

`selftest.py` (pmem profile) and `selftest_ram.py` (ram profile) share these; neither imports the other's code
for them, so the pmem selftest can hand a ram lab to `selftest_ram` without an import cycle.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from belugactl.errors import StepFailed
from belugactl.lab.channel import GuestChannel

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


class StepGuest:
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
        self.run(f"write {len(data)} bytes at {offset:#x} of /dev/{dax}", [*daxpoke_argv(), "write", f"/dev/{dax}",
                                                                           str(offset), data.hex()])

    def peek(self, dax: str, offset: int, length: int) -> bytes:
        out = self.run(f"read {length} bytes at {offset:#x} of /dev/{dax}",
                       [*daxpoke_argv(), "read", f"/dev/{dax}", str(offset), str(length)])
        return bytes.fromhex(out.strip())


def daxpoke_argv() -> list[str]:
    """How to run lab/guest/daxpoke.py in a guest: the host's Python by path, as a script (standard library only)."""
    daxpoke = Path(__file__).parent / "guest" / "daxpoke.py"
    return [os.path.realpath(sys.executable), "-I", "-S", str(daxpoke.resolve())]
