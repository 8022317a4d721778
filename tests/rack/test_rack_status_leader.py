"""`rack status` says who leads each elected metadata server's rack, since when, and the leader changes
each saw (from every host's `status --json` pool summary), as `status` does on one host."""

from __future__ import annotations

import json

from belugactl.cli.rack_render import leader_lines, render_run
from belugactl.workflows.rack.fanout import NodeResult
from belugactl.workflows.rack.orchestrate import RackRun
from belugactl.workflows.serve.control import pool_summary

SINCE = 1764943200.0  # 2025-12-05 14:00:00 UTC
HOSTS = ["lab-1", "lab-2", "lab-3"]


def _stats(member: str, leading: bool, leader: str | None, changes: int, epoch: int) -> dict:
    """A /stats document as the elected server writes it (leader: index; standby: no index, epoch 0)."""
    lead = {
        "member": member,
        "leading": leading,
        "leader": leader,
        "leader_since": SINCE if leader else None,
        "leader_changes": changes,
    }
    doc: dict = {"epoch": epoch, "ready": leading, "leadership": lead}
    if leading:
        doc["index"] = {"entries": 5, "bytes_used": 10, "bytes_capacity": 100}
    return doc


def _run(pools: dict[str, dict | None]) -> RackRun:
    docs = {h: {"state": "ready", "processes": [], "pool": pool_summary(s) if s else None} for h, s in pools.items()}
    results = {h: NodeResult(h, 0, stdout=json.dumps(docs[h])) for h in pools}
    return RackRun("status", list(pools), [list(pools)], results, docs, {}, [])


def test_leader_and_standby_each_say_who_leads_since_when_and_changes(capsys) -> None:
    run = _run(
        {
            "lab-1": _stats("lab-1", False, "lab-2", 1, 0),
            "lab-2": _stats("lab-2", True, "lab-2", 1, 8),
            "lab-3": None,  # not a candidate: no metadata server, no line
        }
    )
    lines = leader_lines(run, 80)
    assert lines[1] == "metadata servers:"
    assert "  lab-1  standby; lab-2 leads since 2025-12-05 14:00:00 UTC, 1 leader" in "\n".join(lines)
    assert any(line.startswith("  lab-2  leads since 2025-12-05 14:00:00 UTC, epoch 8") for line in lines), lines
    assert not any("lab-3" in line for line in lines) and not any(line.startswith(("✗", "!")) for line in lines)
    rows = run.to_dict()["metadata_servers"]
    assert [(r["host"], r["role"], r["leader"], r["leader_changes"]) for r in rows] == [
        ("lab-1", "standby", "lab-2", 1),
        ("lab-2", "leader", "lab-2", 1),
    ]
    render_run(run, matrix=None)
    out = capsys.readouterr().out
    assert "metadata servers:" in out and "lab-2 leads since" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_two_leaders_or_two_named_leaders_are_said() -> None:
    two = _run({"lab-1": _stats("lab-1", True, "lab-1", 0, 7), "lab-2": _stats("lab-2", True, "lab-2", 1, 8)})
    assert any(line.startswith("✗ 2 servers say they lead: lab-1, lab-2") for line in leader_lines(two, 80))
    split = _run({"lab-1": _stats("lab-1", False, "lab-3", 0, 0), "lab-2": _stats("lab-2", True, "lab-2", 1, 8)})
    said = leader_lines(split, 80)
    assert any(line.startswith("! the servers name different leaders: lab-2, lab-3") for line in said)


def test_a_plain_server_is_not_elected_and_a_standby_without_leader_says_so() -> None:
    plain = {"epoch": 3, "ready": True, "index": {"entries": 1}, "leadership": None}
    run = _run({"lab-1": plain, "lab-2": _stats("lab-2", False, None, 0, 0)})
    text = "\n".join(leader_lines(run, 80))
    assert "  lab-1  serves (not elected), epoch 3" in text
    assert "  lab-2  standby; no leader yet, 0 leader change(s) seen" in text
    assert leader_lines(_run({"lab-1": None}), 80) == []
