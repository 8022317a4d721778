"""doctor's etcd checks (checks/etcd.py): parsing on etcd 3.4.23's recorded answers (etcd_recorded/),
the verdicts on numbers, hostile endpoints, and the five checks against a real etcd on loopback."""

from __future__ import annotations

import json
import shlex
import socket
import threading
from pathlib import Path

import pytest

from belugactl.dataplane.mds.leadership import Elector, Etcd3gwKV, leader_key
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.doctor import DoctorContext, Status, builtin_registry
from belugactl.workflows.doctor.checks import etcd as E
from belugactl.workflows.doctor.expectations import from_manifest
from tests.support.doctor_snapshots import beluga_like
from tests.support.etcd import Etcd, require_etcd, running_etcd

REPO = Path(__file__).resolve().parents[2]
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"
RECORDED = Path(__file__).parent / "etcd_recorded"
IDS = ["etcd.reachable", "etcd.quorum", "etcd.clock-skew", "etcd.lease-ttl", "etcd.leader"]
# Member ids of the recorded cluster (members.json): a answered, b led.
A, B, C = "8645782499530242234", "11539305337000706507", "3542974012341521924"


def recorded(name: str):
    return json.loads((RECORDED / name).read_text())


def manifest(endpoints: list[str] | None, candidates: tuple[str, ...] = ("cpu-demo",), ttl: int = 5):
    text = CPU_DEMO.read_text()
    if endpoints is not None:
        old = "  metadata: {admin_bind: 127.0.0.1, admin_port: 9470, rpc_port: 9471, spin_after_ms: 0}\n"
        assert old in text
        conf = json.dumps({"endpoints": endpoints, "candidates": list(candidates), "leader_ttl_s": ttl})
        text = text.replace(old, f"  metadata:\n    admin_bind: 127.0.0.1\n    etcd: {conf}\n")
    return load_manifest_text(text)


def ctx_for(m) -> DoctorContext:
    return DoctorContext(beluga_like(), from_manifest(m, m.host("cpu-demo")))


def run_all(ctx: DoctorContext) -> dict:
    reg = builtin_registry()
    return {i: reg.get(i).run(ctx) for i in IDS}


# --- fast: skips -------------------------------------------------------------------------------
def test_without_etcd_in_the_manifest_or_without_a_manifest_every_check_skips_without_a_fix() -> None:
    for ctx in (ctx_for(manifest(None)), DoctorContext(beluga_like())):
        for check_id, result in run_all(ctx).items():
            assert result.status is Status.SKIP and result.fix is None, (check_id, result)
    assert "no serve.metadata.etcd" in run_all(ctx_for(manifest(None)))["etcd.quorum"].reason
    assert "no manifest (pass -f rack.yaml)" in run_all(DoctorContext(beluga_like()))["etcd.leader"].reason


# --- fast: parsing of the recorded gateway answers -------------------------------------------------
def test_recorded_status_member_list_and_quorum() -> None:
    a, b = E.parse_status(recorded("status-a.json")), E.parse_status(recorded("status-b.json"))
    assert (a.member_id, a.leader_id, a.version, a.errors) == (A, B, "3.4.23", [])
    members = E.parse_members(recorded("members.json"))
    assert sorted(m.name for m in members) == ["a", "b", "c"]
    assert {m.name: m.client_urls for m in members}["b"] == ["http://127.0.0.1:23792"]
    q = E.judge_quorum(members, [a, b])
    assert q.leader is not None and q.leader.name == "b"
    assert sorted(m.name for m in q.healthy) == ["a", "b"] and [m.name for m in q.unseen] == ["c"]
    # b and c stopped: a knows no leader and says so
    lone = E.parse_status(recorded("status-a-no-quorum.json"))
    assert lone.leader_id == "" and lone.errors == ["etcdserver: no leader"]
    q = E.judge_quorum(E.parse_members(recorded("members-no-quorum.json")), [lone])
    assert q.leader is None and q.healthy == []


def test_the_quorum_check_on_recorded_answers(monkeypatch) -> None:
    ctx = ctx_for(manifest(["http://127.0.0.1:23791", "http://127.0.0.1:23792"]))
    members = E.parse_members(recorded("members.json"))

    def probe(*statuses: str) -> E.Probe:
        eps = [E.EndpointProbe(f"http://127.0.0.1:2379{i + 1}", status=E.parse_status(recorded(s)), members=members)
               for i, s in enumerate(statuses)]  # fmt: skip
        return E.Probe(eps)

    quorum = builtin_registry().get("etcd.quorum")
    monkeypatch.setattr(E, "_probe", lambda _ctx: probe("status-a.json", "status-b.json"))
    result = quorum.run(ctx)  # c gave no status: 2 of 3 is a quorum, but one more loss stops the rack
    assert result.status is Status.WARN and "leader b, 2 of 3" in result.reason and "c (no answer" in result.reason
    assert "stops" in result.reason and result.details["leader"] == "b"
    c_status = dict(recorded("status-a.json"), header=dict(recorded("status-a.json")["header"], member_id=C))
    p = probe("status-a.json", "status-b.json")
    p.extra = {"c": E.EndpointProbe("c", status=E.parse_status(c_status))}
    monkeypatch.setattr(E, "_probe", lambda _ctx: p)
    assert quorum.run(ctx).status is Status.OK
    monkeypatch.setattr(E, "_probe", lambda _ctx: probe("status-a-no-quorum.json"))
    result = quorum.run(ctx)
    assert result.status is Status.FAIL and "no quorum" in result.reason and "etcdserver: no leader" in result.reason
    assert "2 of 3 run" in (result.fix or "")


def test_members_the_manifest_does_not_list_are_asked_for_their_status(monkeypatch) -> None:
    ctx = ctx_for(manifest(["http://127.0.0.1:23791"]))
    asked: list[tuple[list[str], bool]] = []

    def ask_all(urls: list[str], full: bool = True, budget_s: float = E.BUDGET_S) -> list[E.EndpointProbe]:
        asked.append((urls, full))
        if full:
            return [E.EndpointProbe(urls[0], status=E.parse_status(recorded("status-a.json")),
                                    members=E.parse_members(recorded("members.json")))]  # fmt: skip
        return [E.EndpointProbe(u, status=E.parse_status(recorded("status-b.json"))) for u in urls]

    monkeypatch.setattr(E, "ask_all", ask_all)
    hostile = recorded("members.json")
    hostile["members"].append({"ID": "1", "name": "evil", "clientURLs": ["file:///etc/passwd"]})
    hostile["members"].append({"ID": "2", "name": "path", "clientURLs": ["http://10.0.0.9:2379/x?y"]})
    monkeypatch.setattr(E, "parse_members", lambda doc, real=E.parse_members: real(hostile))
    probe = E._probe(ctx)
    assert asked == [(["http://127.0.0.1:23791"], True), (["http://127.0.0.1:23793", "http://127.0.0.1:23792"], False)]
    assert set(probe.extra) == {"http://127.0.0.1:23792", "http://127.0.0.1:23793"}
    assert E._probe(ctx) is probe and len(asked) == 2  # the five checks of one run share one probe


def test_recorded_leader_key_and_the_leader_verdicts() -> None:
    key = E.parse_range(recorded("range-leader.json"))
    assert key is not None and (key.member, key.since, key.pid) == ("mds-a", 1764939000.5, 4242)
    assert key.lease == recorded("grant.json")["ID"]
    assert E.parse_range(recorded("range-empty.json")) is None
    now = 1764939000.5 + 60
    ok = E.judge_leader(key, ["mds-a", "mds-b"], "r", "FIX", now)
    assert ok.status is Status.OK and "mds-a leads, for 60 s" in ok.reason
    stranger = E.judge_leader(key, ["mds-b", "mds-c"], "r", "FIX", now)
    assert stranger.status is Status.WARN and "not in serve.metadata.etcd.candidates" in stranger.reason
    none = E.judge_leader(None, ["mds-a"], "r", "FIX", now)
    assert none.status is Status.WARN and "not serving" in none.reason and none.fix == "FIX"


def test_hostile_answers_are_refused_field_by_field() -> None:
    for doc in (None, [], {"members": "x"}, {"members": [{"name": "no id"}]}, {"members": [{"ID": "-1"}]}):
        with pytest.raises(ValueError):
            E.parse_members(doc)
    for doc in (None, "x", {"leader": "1"}):
        with pytest.raises(ValueError):
            E.parse_status(doc)
    s = E.parse_status({"header": {"member_id": 7}, "leader": True, "errors": ["e" * 5000] * 100})
    assert s.leader_id == "" and len(s.errors) == 8 and len(s.errors[0]) == 200
    junk = dict(recorded("range-leader.json"))
    junk["kvs"] = [dict(junk["kvs"][0], value="!!not base64")]
    assert E.parse_range(junk).member == "?"


# --- fast: clock skew and lease verdicts on numbers ------------------------------------------------
def test_clock_skew_bounds_from_the_recorded_date_header() -> None:
    date = (RECORDED / "version-date-header.txt").read_text().split(":", 1)[1].strip()
    d = E.skew_bounds(date, 0.0, 0.0)[0]  # the Date's own time stamp
    lo, hi = E.skew_bounds(date, d + 0.4, 0.2)  # stamped within [d + 0.4, d + 0.6] of our clock
    assert lo == pytest.approx(-0.6) and hi == pytest.approx(0.6)
    assert E.judge_skew({"u": (lo, hi)}).status is Status.OK
    late = E.judge_skew({"u": E.skew_bounds(date, d + 3.0, 0.01)})  # our clock 3 s ahead of etcd's
    assert late.status is Status.WARN and "-3.0 s to -2.0 s" in late.reason and "set-ntp" in (late.fix or "")
    # whole-second resolution: 1.4 s ahead may be 0.4 s, which is not certainly past 1 s
    assert E.judge_skew({"u": E.skew_bounds(date, d + 1.4, 0.01)}).status is Status.OK


def test_lease_verdicts_name_the_numbers() -> None:
    ok = E.judge_lease(E.LeaseFacts(5, 5, 0.003))
    assert ok.status is Status.OK and "0.83 s to spare" in ok.reason
    assert E.judge_lease(E.LeaseFacts(2, 2, 0.2)).status is Status.WARN  # 2/3 + 0.5 + 0.2 + 0.2 > 1.5
    slow = E.judge_lease(E.LeaseFacts(5, 5, 2.5))
    assert slow.status is Status.FAIL and "longer than the 1.00 s the leader gives it" in slow.reason
    ttl_small = E.judge_lease(E.LeaseFacts(0.5, 1, 0.001))  # what the manifest refuses (ge=2): the margin is 0.5 s
    assert ttl_small.status is Status.FAIL and "margin is not below the TTL" in ttl_small.reason
    long_grant = E.judge_lease(E.LeaseFacts(5, 8, 0.003))
    assert long_grant.status is Status.FAIL and "grants 8 s for a 5 s lease" in long_grant.reason
    assert "--election-timeout" in (long_grant.fix or "")


# --- fast: an endpoint that accepts and never answers costs the budget, no more ----------------------
def test_a_silent_endpoint_is_reported_as_not_answering() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                continue

    threading.Thread(target=hold, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        (got,) = E.ask_all([url], budget_s=0.3)
        assert got.error and got.status is None
    finally:
        stop.set()
        for s in accepted:
            s.close()
        srv.close()


# --- a real etcd on loopback ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def etcd():
    with running_etcd() as e:
        yield e


@pytest.mark.process
def test_real_etcd_one_member_and_no_leader_key(etcd: Etcd) -> None:
    results = run_all(ctx_for(manifest([etcd.url])))
    assert results["etcd.reachable"].status is Status.OK and "3.4" in results["etcd.reachable"].reason
    q = results["etcd.quorum"]
    assert q.status is Status.WARN and "leader t0, 1 of 1" in q.reason and "three members" in q.reason
    assert results["etcd.clock-skew"].status is Status.OK
    lease = results["etcd.lease-ttl"]
    assert lease.status is Status.OK and lease.details["granted_s"] == 5
    assert results["etcd.leader"].status is Status.WARN and "not serving" in results["etcd.leader"].reason
    assert "metadata-server" in (results["etcd.leader"].fix or "")


@pytest.mark.process
def test_real_etcd_a_held_leader_key_is_named(etcd: Etcd) -> None:
    m = manifest([etcd.url], candidates=("cpu-demo",))
    leader = builtin_registry().get("etcd.leader")
    elector = Elector(Etcd3gwKV([etcd.url]), "cpu-demo", leader_key(m.name), ttl_s=5)
    assert elector.campaign()
    try:
        result = leader.run(ctx_for(m))
        assert result.status is Status.OK and "cpu-demo leads" in result.reason
    finally:
        elector.resign()
    # A server started by hand under a member name that is not a candidate (candidates are hosts)
    stranger = Elector(Etcd3gwKV([etcd.url]), "mds-a", leader_key(m.name), ttl_s=5)
    assert stranger.campaign()
    try:
        result = leader.run(ctx_for(m))
        assert result.status is Status.WARN and "mds-a leads" in result.reason and "candidates" in result.reason
    finally:
        stranger.resign()


@pytest.mark.process
def test_real_etcd_stopped_fails_reachable_and_quorum() -> None:
    with running_etcd() as e:
        ctx = ctx_for(manifest([e.url]))
        e.stop()
        results = run_all(ctx)
    r = results["etcd.reachable"]
    assert r.status is Status.FAIL and e.url in r.reason and r.details["unreachable"] == [e.url]
    assert results["etcd.quorum"].status is Status.FAIL
    for check_id in ("etcd.clock-skew", "etcd.lease-ttl", "etcd.leader"):
        assert results[check_id].status is Status.SKIP and results[check_id].fix is None


class SlowElectionEtcd(Etcd):
    """etcd with a 5 s election timeout: its minimum lease TTL is ceil(1.5 * 5 s) = 8 s."""

    def start(self, timeout_s: float = 20.0) -> None:
        real = self.binary
        wrapper = self.data_dir.parent / "etcd-slow-election"
        flags = "--heartbeat-interval 500 --election-timeout 5000"  # the last of a repeated flag counts
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@" {flags}\n')
        wrapper.chmod(0o755)
        self.binary = str(wrapper)
        try:
            super().start(timeout_s)
        finally:
            self.binary = real


@pytest.mark.process
def test_real_etcd_whose_election_outlasts_the_lease_fails_lease_ttl(tmp_path: Path) -> None:
    e = SlowElectionEtcd(require_etcd(), tmp_path / "data")
    e.start()
    try:
        result = builtin_registry().get("etcd.lease-ttl").run(ctx_for(manifest([e.url])))
    finally:
        e.stop()
    assert result.status is Status.FAIL and "grants 8 s for a 5 s lease" in result.reason, result
    assert result.details["granted_s"] == 8


def test_every_check_is_registered_in_order() -> None:
    ids = builtin_registry().ids
    assert [i for i in ids if i.startswith("etcd.")] == IDS


def _port_pairs(n: int) -> list[int]:
    """n client ports whose next port (the peer's) is free too."""
    import socket

    out: list[int] = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        if port not in out and port + 1 not in out and port - 1 not in out:
            out.append(port)
    return out


@pytest.mark.process
def test_real_three_member_cluster_from_the_units_arguments_loses_quorum(tmp_path: Path) -> None:
    import subprocess

    from belugactl.workflows.setup.systemd import etcd_argv, etcd_members

    binary = require_etcd()
    m = manifest([f"http://127.0.0.1:{p}" for p in _port_pairs(3)])
    members = etcd_members(m)
    assert len({name for name, *_ in members}) == 3  # three endpoints on one host: cpu-demo-PORT each
    procs = []
    try:
        for name, *_ in members:
            argv = etcd_argv(m, name, binary=binary)
            argv[argv.index("--data-dir") + 1] = str(tmp_path / name)
            log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - the process holds it
            procs.append(subprocess.Popen(argv, stdout=log, stderr=log))  # noqa: S603
            log.close()
        quorum = builtin_registry().get("etcd.quorum")
        for _ in range(200):  # the first election: about a second at etcd's default timings
            result = quorum.run(ctx_for(m))
            if result.status is Status.OK:
                break
            threading.Event().wait(0.05)
        assert result.status is Status.OK and "3 of 3 members healthy" in result.reason, result
        procs[0].terminate()
        procs[0].wait(timeout=10)
        result = quorum.run(ctx_for(m))
        assert result.status is Status.WARN and "2 of 3" in result.reason and "stops the rack" in result.reason
        procs[1].terminate()
        procs[1].wait(timeout=10)
        results = run_all(ctx_for(m))
        assert results["etcd.quorum"].status is Status.FAIL and "1 of 3 members healthy, 2 needed" in (
            results["etcd.quorum"].reason
        )
        assert results["etcd.reachable"].status is Status.FAIL and "2 of 3" in results["etcd.reachable"].reason
        # the lone member answers its status but grants no lease and serves no linearizable read
        assert results["etcd.lease-ttl"].status is Status.FAIL and "grants or keeps no lease" in (
            results["etcd.lease-ttl"].reason
        )
        assert results["etcd.leader"].status is Status.FAIL and "cannot read the leader key" in (
            results["etcd.leader"].reason
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
