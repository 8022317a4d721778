"""`rack serve --rolling`: one host at a time, stop then serve, the leading metadata server's host and
then the front door's last, and a host that fails to come back stops the roll. Each "host" runs a
small local program standing in for belugactl (it answers `status`, `stop` and `serve` with the JSON
documents belugactl prints, and logs each call), so the order is what a real rack would see."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from belugactl.workflows.rack.fanout import CommandTransport
from belugactl.workflows.rack.orchestrate import RackTarget, rack_serve_rolling
from belugactl.workflows.rack_context import load_rack_context

pytestmark = pytest.mark.process  # each "host" is a real process
REPO = Path(__file__).resolve().parents[2]
ANCHOR = "    host: lab-1\n"

FAKE = r"""
import json, sys
log, leader, fail, host, verb = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
with open(log, "a") as f:
    f.write(f"{host} {verb}\n")
if verb == "status":
    lead = {"member": host, "leading": host == leader, "leader": leader, "leader_since": 1.0, "leader_changes": 0}
    print(json.dumps({"state": "ready", "processes": [], "pool": {"member": host, "leading": host == leader,
                      "leader": leader, "ready": host == leader}}))
elif verb == "stop":
    print(json.dumps({"stopped": ["vllm-0"], "nothing_running": False}))
elif host == fail:
    print(json.dumps({"error": {"message": "vllm-0 did not become ready"}}))
    sys.exit(1)
else:
    print(json.dumps({"state": "ready", "processes": []}))
"""


class FakeHosts(CommandTransport):
    def __init__(self, script: Path, log: Path, leader: str, fail: str = "") -> None:
        super().__init__(prefix=[])
        self.script, self.log, self.leader, self.fail = script, log, leader, fail

    def argv(self, host, remote):
        verb = next(a for a in remote if a in ("status", "stop", "serve"))
        return [sys.executable, str(self.script), str(self.log), self.leader, self.fail, host, verb]


def _target(tmp_path: Path, leader: str, fail: str = "", router: list[str] | None = None) -> tuple[RackTarget, Path]:
    text = (REPO / "examples" / "lab.yaml").read_text()
    hosts = "  - name: lab-3\n    address: 10.0.2.17\n    roles: [worker]\n"
    text = text.replace("  - name: lab-2\n", hosts + "  - name: lab-2\n", 1)
    conf = json.dumps({"endpoints": ["http://10.0.2.15:2379"], "candidates": ["lab-1", "lab-2"]})
    text = text.replace(ANCHOR, f"{ANCHOR}    etcd: {conf}\n")
    if router is not None:
        text = text.replace("serve:\n", f"serve:\n  router: {{hosts: {json.dumps(router)}}}\n", 1)
    path = tmp_path / "rack.yaml"
    path.write_text(text)
    script, log = tmp_path / "fake.py", tmp_path / "calls.log"
    script.write_text(FAKE)
    rack = load_rack_context(path)
    target = RackTarget(
        rack=rack, hosts=[h.name for h in rack.manifest.hosts], transport=FakeHosts(script, log, leader, fail)
    )
    return target, log


def test_one_host_at_a_time_the_leader_last(tmp_path: Path) -> None:
    target, log = _target(tmp_path, leader="lab-1")
    run = rack_serve_rolling(target, dry_run=False)
    calls = log.read_text().split("\n")[3:-1]  # after the three status calls
    hosts = [h for h, v in (c.split() for c in calls) if v == "stop"]
    assert hosts[-1] == "lab-1" and sorted(hosts) == sorted(target.hosts)
    # Each host stopped and served before the next is touched.
    assert calls == [f"{h} {v}" for h in hosts for v in ("stop", "serve")]
    assert not run.failed and run.order == [[h] for h in hosts]
    assert run.summary().exit_code == 0


def test_the_front_door_host_goes_last_after_the_leader(tmp_path: Path) -> None:
    target, log = _target(tmp_path, leader="lab-2", router=["lab-1"])
    rack_serve_rolling(target, dry_run=False)
    stops = [c.split()[0] for c in log.read_text().splitlines() if c.endswith(" stop")]
    assert stops[-2:] == ["lab-2", "lab-1"]


def test_a_host_that_does_not_come_back_stops_the_roll(tmp_path: Path) -> None:
    target, log = _target(tmp_path, leader="lab-1", fail="lab-3")
    run = rack_serve_rolling(target, dry_run=False)
    order = [h for (h,) in run.order]
    after = order[order.index("lab-3") + 1 :]
    assert run.failed and "lab-3" in run.failed_hosts and run.not_run == after and after
    touched = {c.split()[0] for c in log.read_text().splitlines()[3:]}
    assert not touched & set(after)  # the hosts after it were not stopped
    assert run.summary().exit_code != 0


def test_dry_run_stops_nothing(tmp_path: Path) -> None:
    target, log = _target(tmp_path, leader="lab-1")
    run = rack_serve_rolling(target, dry_run=True)
    assert not any(c.endswith(" stop") for c in log.read_text().splitlines()) and not run.failed
