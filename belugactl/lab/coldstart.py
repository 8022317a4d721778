"""`belugactl lab coldstart`: from nothing to every host's doctor green, timed phase by phase.

It boots a lab sized from the manifest (one guest per host, the manifest's pool size), then runs
`belugactl setup` and `belugactl doctor` in every guest, all guests at once, and reports how long each
phase took. Setup runs in parallel on purpose: the header step lets one host write the pool header
and the others verify it, whoever gets there first (`header.write`). Phases:

- boot: QEMU start to every guest's agent answering (kernel, initramfs, modules, agent);
- warm (the phase's name in the report): until every guest's resident CLI
  (`belugactl.lab.guest.resident_cli`) has imported the CLI; absent with BELUGACTL_LAB_WARM=0, where
  each command pays its own Python start-up instead;
- setup: every guest's `belugactl setup` (run from this checkout), slowest guest;
- doctor: every guest's `belugactl doctor`, slowest guest; must be green on all.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import belugactl
from belugactl.errors import StepFailed, UsageError
from belugactl.lab import emulated_rack
from belugactl.lab.channel import GuestChannel

TARGET_S = 90.0  # the target for the demo rack on a 2-core machine
RESIDENT_TIMEOUT_S = 300.0
COMMAND_TIMEOUT_S = 900.0

Progress = Callable[[str], None]


@dataclass
class HostRun:
    host: str
    command: str
    rc: int
    seconds: float
    resident: bool  # run by the guest's resident CLI, not spawned ("warm" in the JSON, a public key)
    summary: str

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "command": self.command, "rc": self.rc, "seconds": round(self.seconds, 1),
                "warm": self.resident, "summary": self.summary}


@dataclass
class ColdStartReport:
    lab: str
    manifest: str
    profile: str
    hosts: int
    devices: int
    switch: bool
    phases: list[tuple[str, float]] = field(default_factory=list)
    runs: list[HostRun] = field(default_factory=list)
    kept: bool = False

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.phases)

    @property
    def green(self) -> bool:
        doctors = [r for r in self.runs if r.command == "doctor"]
        return bool(doctors) and all(r.rc == 0 for r in self.runs)

    def to_dict(self) -> dict[str, object]:
        return {
            "lab": self.lab, "manifest": self.manifest, "profile": self.profile, "hosts": self.hosts,
            "devices": self.devices, "switch": self.switch,
            "phases": [{"phase": p, "seconds": round(s, 1)} for p, s in self.phases],
            "total_s": round(self.total_s, 1), "target_s": TARGET_S, "green": self.green,
            "runs": [r.to_dict() for r in self.runs], "kept": self.kept,
        }  # fmt: skip


def _check_lab_hosts(manifest_path: str, names: list[str]) -> None:
    """The manifest's hosts must be the lab's guests, lab-1 to lab-N in order."""
    expected = [f"lab-{i}" for i in range(1, len(names) + 1)]
    if names != expected:
        raise UsageError(
            f"{manifest_path} names hosts {', '.join(names)}; a lab's guests are {', '.join(expected)}",
            fix="use a lab manifest (examples/lab-ram.yaml, examples/lab-ram-rack.yaml, examples/lab.yaml)",
        )


def _wait_for_resident_cli(chans: list[GuestChannel], spools: dict[str, Path], deadline: float) -> None:
    """Until every guest's resident-cli.log carries the resident CLI's ready line."""
    pending = {c.name for c in chans}
    while pending:
        for name in sorted(pending):
            log = spools[name] / "resident-cli.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if '"ready_s"' in text:
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise StepFailed(f"the resident CLI did not start in {', '.join(sorted(pending))}",
                             why=f"no ready line in resident-cli.log after {RESIDENT_TIMEOUT_S:.0f} s",
                             fix=f"read {spools[min(pending)] / 'resident-cli.log'}; "
                                 "BELUGACTL_LAB_WARM=0 runs without it")
        time.sleep(0.25)


def _run_all(chans: list[GuestChannel], command: str, manifest: str) -> list[HostRun]:
    repo = str(Path(belugactl.__file__).resolve().parent.parent)

    def one(ch: GuestChannel) -> HostRun:
        t0 = time.monotonic()
        r = ch.run(["belugactl", command, "-f", manifest, "--host", ch.name, "--json"], timeout=COMMAND_TIMEOUT_S,
                   cwd=repo, env={"PYTHONPATH": repo})
        seconds = time.monotonic() - t0
        return HostRun(ch.name, command, r.returncode, seconds, r.resident, _summary(command, r.stdout, r.stderr))

    with ThreadPoolExecutor(len(chans)) as pool:
        return list(pool.map(one, chans))


def _summary(command: str, stdout: bytes, stderr: bytes) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return (stderr or stdout).decode(errors="replace").strip().splitlines()[-1:][0][:200] if (stderr or stdout) \
            else "no output"
    if command == "setup":
        return f"{len(doc.get('applied', []))} step(s) applied"
    checks = doc.get("checks", [])
    count = {s: sum(1 for c in checks if c.get("status") == s) for s in ("ok", "warning", "fail", "skip")}
    failed = [c["id"] for c in checks if c.get("status") == "fail"]
    return (f"{count['ok']} ok, {count['warning']} warning, {count['fail']} failed, {count['skip']} skipped"
            + (f" ({', '.join(failed)})" if failed else ""))


def run(
    manifest: str,
    *,
    hosts: list[str],
    pool_size: int,
    name: str = "coldstart",
    profile: str = "ram",
    devices: int = 2,
    switch: bool = True,
    keep: bool = False,
    progress: Progress = lambda _m: None,
) -> ColdStartReport:
    manifest = os.path.abspath(manifest)
    _check_lab_hosts(manifest, hosts)
    if emulated_rack.load(emulated_rack.lab_paths(name)) is not None:
        raise UsageError(f"lab {name!r} already exists; a cold start needs a fresh one",
                         fix=f"belugactl lab down --name {name}, or pick another --name")
    report = ColdStartReport(name, manifest, profile, len(hosts), devices, switch)
    resident = os.environ.get(emulated_rack.RESIDENT_CLI_ENV, "1") != "0"
    t0 = time.monotonic()
    try:
        up = emulated_rack.up(name=name, hosts=len(hosts), pool_size=pool_size, profile=profile, devices=devices,
                     switch=switch, progress=progress)
        report.phases.append(("boot: QEMU start to every agent ready", time.monotonic() - t0))
        guests = up.status.guests
        spools = {g.name: emulated_rack.lab_paths(name).guest(g.name).spool for g in guests}
        chans = [emulated_rack.channel(name, g.name) for g in guests]
        if resident:
            t0 = time.monotonic()
            _wait_for_resident_cli(chans, spools, t0 + RESIDENT_TIMEOUT_S)
            report.phases.append(("warm: resident belugactl imported in every guest", time.monotonic() - t0))
        for command in ("setup", "doctor"):
            progress(f"{command} in {', '.join(c.name for c in chans)} (in parallel)")
            t0 = time.monotonic()
            runs = _run_all(chans, command, manifest)
            report.phases.append((f"{command}: every guest in parallel (slowest)", time.monotonic() - t0))
            report.runs.extend(runs)
            if any(r.rc != 0 for r in runs):
                break
        report.kept = keep
        return report
    finally:
        if not keep:
            emulated_rack.down(name)
