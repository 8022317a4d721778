"""A 16-host rack in a few milliseconds: a transport whose hosts answer `belugactl rack`'s per-host
commands with canned JSON, each answer a real short process (`printf`, or Python for a non-zero exit).

`rack doctor`, `rack setup`, `rack status` then run their real fan-out, parsing and rendering; only
what a host would print is made up. A host listed in `unreachable` exits 255 with OpenSSH's message,
as `ssh` does when it cannot reach a host.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from belugactl.workflows.rack.fanout import SSH_TRANSPORT_FAILURE, Transport

Check = tuple[str, str, str | None]  # status, reason, fix


@dataclass
class FakeRack(Transport):
    """Hosts that answer from `info` (this machine's facts), `checks` (a doctor document's checks) and
    the per-host changes below. `calls` records every (host, verb) asked, in order."""

    hosts: list[str]
    info: dict[str, Any]
    checks: list[dict[str, Any]]
    failing: dict[str, dict[str, Check]] = field(default_factory=dict)  # host -> check id -> cell
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> ssh's stderr
    versions: dict[str, str] = field(default_factory=dict)  # host -> another belugactl version
    setup_fails: dict[str, str] = field(default_factory=dict)  # host -> the error setup prints
    addresses: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    name = "ssh"
    unreachable_rc = SSH_TRANSPORT_FAILURE

    def argv(self, host: str, remote: Sequence[str]) -> list[str]:
        verb = _verb(remote)
        self.calls.append((host, verb))
        if host in self.unreachable:
            return _exit(SSH_TRANSPORT_FAILURE, "", self.unreachable[host])
        if verb == "setup" and host in self.setup_fails:
            error = {"ok": False, "error": {"code": 1, "kind": "StepFailed", "message": self.setup_fails[host]}}
            return _exit(1, json.dumps(error), f"error: {self.setup_fails[host]}")
        answer = json.dumps(self._answer(host, verb, list(remote)))
        if verb == "doctor" and any(cell[0] == "fail" for cell in self.failing.get(host, {}).values()):
            return _exit(1, answer, "")  # as doctor exits when a check fails
        return ["printf", "%s", answer]

    def address(self, host: str) -> str:
        return self.addresses.get(host, host)

    def _answer(self, host: str, verb: str, remote: list[str]) -> dict[str, Any]:
        if verb == "info":
            version = self.versions.get(host, self.info["belugactl_version"])
            return {**self.info, "host": host, "belugactl_version": version}
        if verb == "doctor":
            cells = self.failing.get(host, {})
            checks = [
                {**c, "status": cells[c["id"]][0], "reason": cells[c["id"]][1], "fix": cells[c["id"]][2]}
                if c["id"] in cells
                else c
                for c in self.checks
            ]
            return {"checks": checks, "failed": any(c["status"] == "fail" for c in checks)}
        if verb == "probe-write":
            return {"host": host, "pool": "/dev/dax0.0", "offset": 0, "nonce": 1}
        if verb == "probe-read":
            seen = {h: {"status": "ok", "detail": "written 0.1 s ago", "offset": 0} for h in self.hosts}
            return {"host": host, "pool": "/dev/dax0.0", "seen": seen}
        if verb == "setup":
            return {"report": {"applied": [], "remaining": [], "failed": None, "dry_run": "--dry-run" in remote}}
        if verb == "status":
            return {"running": False, "state": "stopped", "processes": []}
        return {"stopped": [], "nothing_running": True, "skipped": []}


def _verb(remote: Sequence[str]) -> str:
    for word in ("info", "probe-write", "probe-read", "doctor", "setup", "serve", "status", "stop"):
        if word in remote:
            return word
    raise AssertionError(f"not a rack per-host command: {remote}")


def _exit(code: int, stdout: str, stderr: str) -> list[str]:
    script = (
        "import sys; sys.stdout.write(sys.argv[1]); sys.stderr.write(sys.argv[2] + '\\n'); sys.exit(int(sys.argv[3]))"
    )
    return [sys.executable, "-S", "-I", "-c", script, stdout, stderr, str(code)]


DDIO = (
    "fail",
    "DDIO is on (use_allocating_flow_wr set) at 0000:15:01.0 (0x180=0x80): writes from the CXL adapter land "
    "in the last-level cache first",
    "as root: setpci -s 0000:15:01.0 180.b=00:88; setpci -s 0000:15:01.0 185.b=01:01",
)
HUGEPAGES = (
    "fail",
    "too few hugepages: node 0: 4096/16384 x 2 MiB; node 1: 4096/16384 x 2 MiB",
    "echo 16384 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
)
THP = ("warn", "THP is madvise, the manifest asks for always", None)


def beluga_rack(rack: Any) -> FakeRack:
    """The 16-host example with trouble an operator meets: DDIO on two hosts, hugepages short on one, an
    old belugactl on one, a warning on three, and two hosts ssh cannot reach (no route; no DNS name)."""
    from belugactl.workflows.doctor.workflow import builtin_registry
    from belugactl.workflows.rack.host_tasks import host_info

    checks = [
        {"id": c.id, "title": c.title, "status": "ok", "reason": "as expected", "fix": None} for c in builtin_registry()
    ]
    return FakeRack(
        hosts=rack.manifest.host_names(),
        # beluga-09's address is a DNS name that does not resolve
        addresses={h.name: h.address for h in rack.manifest.hosts} | {"beluga-09": "beluga-09.rack.example"},
        info=host_info(rack),
        checks=checks,
        failing={
            "beluga-03": {"ddio.disabled": DDIO},
            "beluga-07": {"ddio.disabled": DDIO, "thp.mode": THP},
            "beluga-12": {"hugepages.per-node": HUGEPAGES},
            "beluga-13": {"thp.mode": THP},
            "beluga-14": {"thp.mode": THP},
        },
        versions={"beluga-11": "0.0.1"},
        unreachable={
            "beluga-05": "ssh: connect to host 10.10.0.16 port 22: No route to host",
            "beluga-09": "ssh: Could not resolve hostname beluga-09.rack.example: Name or service not known",
        },
    )
