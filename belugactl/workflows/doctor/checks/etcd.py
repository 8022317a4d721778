"""The etcd cluster that elects the metadata leader (serve.metadata.etcd; dataplane/mds/leadership.py).

Five checks, run only when the manifest has `serve.metadata.etcd`: every endpoint answers, the
cluster has a leader and a quorum, the clocks agree, the leader's lease TTL leaves room for etcd's
round trip measured now, and who holds the leader key. They speak plain HTTP to etcd's JSON gateway
(urllib, no proxy, no subprocess), every endpoint in parallel under one deadline (`BUDGET_S`), so a
silent or slow-dripping endpoint costs about a second whatever the network does. Answers are hostile
input: read at most `MAX_BODY` bytes, parsed field by field, never trusted to be well formed.

The probe is made once per doctor run and shared by the checks (`_probe`). The lease check grants
one lease with the manifest's TTL, keeps it alive once and revokes it (no key is bound to it): the
same three requests the leader makes, timed on this host.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import json
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from belugactl.workflows.doctor.checks.common import manifest_arg
from belugactl.workflows.doctor.context import DoctorContext
from belugactl.workflows.doctor.registry import REGISTRY
from belugactl.workflows.doctor.result import CheckResult, Severity

BUDGET_S = 1.0  # every request to one endpoint together; the endpoints are asked in parallel
MAX_BODY = 1 << 20  # an answer longer than this is not etcd's
# The wall-clock offset past which etcd.clock-skew warns. The leader's deadline uses monotonic clocks
# only (leadership.py), so an offset alone cannot make two leaders; but a host whose clock is off by
# more than this has no working time sync, and then nothing bounds its clock's *rate* either, which the
# Elector's margin (max(0.5 s, TTL/5): 1 s of a 5 s TTL) assumes is small over one TTL. It is also
# etcd's own threshold (its peers log "prober detected unhealthy status ... clock difference" past 1 s)
# and what makes the leader key's `since` and the logs of two hosts comparable. The HTTP Date header
# has whole seconds, so no smaller threshold could be told apart from rounding.
SKEW_WARN_S = 1.0
NO_ETCD = "no serve.metadata.etcd in the manifest: the metadata server runs without an election"
NO_MANIFEST = "no manifest (pass -f rack.yaml): its serve.metadata.etcd names the etcd to check"


# --- the etcd conf and the probe -----------------------------------------------------------------
def etcd_conf(ctx: DoctorContext) -> Any:
    m = ctx.expect.manifest if ctx.expect is not None else None
    serve = getattr(m, "serve", None)
    metadata = getattr(serve, "metadata", None)
    return getattr(metadata, "etcd", None)


def _skip(ctx: DoctorContext) -> CheckResult | None:
    """The etcd checks' skip (a skip carries no fix): no manifest, or one without serve.metadata.etcd."""
    if ctx.expect is None or ctx.expect.manifest is None:
        return CheckResult.skip(NO_MANIFEST)
    if etcd_conf(ctx) is None:
        return CheckResult.skip(NO_ETCD)
    return None


@dataclass
class Answer:
    """One HTTP exchange: the JSON document (None when it was not one), the Date header, timings."""

    status: int
    doc: Any
    date: str | None
    sent_wall: float  # local wall clock when the request was sent
    rtt_s: float


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def http_json(url: str, body: dict | None, timeout_s: float) -> Answer:
    """GET (body None) or POST JSON; OSError/ValueError on anything but a JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    wall = time.time()
    t0 = time.monotonic()
    try:
        resp = _OPENER.open(req, timeout=max(0.05, timeout_s))
    except urllib.error.HTTPError as exc:
        status, raw, date = exc.code, exc.read(MAX_BODY + 1), exc.headers.get("Date")
    else:
        with resp:
            status, raw, date = resp.status, resp.read(MAX_BODY + 1), resp.headers.get("Date")
    rtt = time.monotonic() - t0
    if len(raw) > MAX_BODY:
        raise ValueError(f"an answer over {MAX_BODY} bytes")
    doc = json.loads(raw) if raw else None
    return Answer(status, doc, date, wall, rtt)


def _s(value: Any) -> str:
    """An int64 of the gateway (a JSON string, or a number from other versions) as a decimal string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return ""
    text = str(value)
    return text if text.isdigit() and len(text) <= 20 else ""


@dataclass
class MemberStatus:
    """What /v3/maintenance/status says of the member that answered."""

    member_id: str
    leader_id: str  # "" when it knows no leader
    version: str
    errors: list[str]


def parse_status(doc: Any) -> MemberStatus:
    if not isinstance(doc, dict) or not isinstance(doc.get("header"), dict):
        raise ValueError("not an etcd status answer")
    errors = doc.get("errors") or []
    errors = [str(e)[:200] for e in errors][:8] if isinstance(errors, list) else ["?"]
    leader = _s(doc.get("leader"))
    version = doc.get("version")
    return MemberStatus(
        _s(doc["header"].get("member_id")),
        "" if leader in ("", "0") else leader,
        str(version)[:32] if isinstance(version, str) else "?",
        errors,
    )


@dataclass
class Member:
    id: str
    name: str
    client_urls: list[str]


def parse_members(doc: Any) -> list[Member]:
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list):
        raise ValueError("not an etcd member list")
    out = []
    for m in doc["members"][:64]:
        if not isinstance(m, dict) or not _s(m.get("ID")):
            raise ValueError("a member without an ID")
        urls = m.get("clientURLs") or []
        urls = [u for u in urls if isinstance(u, str) and u.isprintable()][:8] if isinstance(urls, list) else []
        name = m.get("name")
        out.append(Member(_s(m["ID"]), name[:128] if isinstance(name, str) and name.isprintable() else "", urls))
    return out


@dataclass
class EndpointProbe:
    url: str
    error: str = ""
    version: Answer | None = None
    status: MemberStatus | None = None
    members: list[Member] | None = None


@dataclass
class Probe:
    endpoints: list[EndpointProbe]
    extra: dict[str, EndpointProbe] = field(default_factory=dict)  # members' client URLs not in the manifest

    @property
    def answering(self) -> list[EndpointProbe]:
        return [e for e in self.endpoints if not e.error]


def _ask_endpoint(url: str, deadline: float, full: bool) -> EndpointProbe:
    out = EndpointProbe(url)
    try:
        if full:
            out.version = http_json(url + "/version", None, deadline - time.monotonic())
            if not isinstance(out.version.doc, dict) or "etcdserver" not in out.version.doc:
                raise ValueError("/version did not name an etcd server")
        out.status = parse_status(http_json(url + "/v3/maintenance/status", {}, deadline - time.monotonic()).doc)
        if full:
            out.members = parse_members(http_json(url + "/v3/cluster/member/list", {}, deadline - time.monotonic()).doc)
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; JSON errors ValueErrors
        out.error = _why(exc)
    return out


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = str(reason if reason is not None else exc) or type(exc).__name__
    return text[:200]


def ask_all(urls: list[str], full: bool = True, budget_s: float = BUDGET_S) -> list[EndpointProbe]:
    """Every URL at once; what has not answered within the budget (plus a little) is marked so."""
    deadline = time.monotonic() + budget_s
    results: dict[int, EndpointProbe] = {}

    def run(i: int, url: str) -> None:
        results[i] = _ask_endpoint(url, deadline, full)

    threads = [threading.Thread(target=run, args=(i, u), daemon=True) for i, u in enumerate(urls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 0.25 - time.monotonic()))
    return [results.get(i) or EndpointProbe(u, error=f"no answer within {budget_s:g} s") for i, u in enumerate(urls)]


_LAST: list[tuple[DoctorContext, Probe]] = []  # the last run's probe: the five checks share it


def _probe(ctx: DoctorContext) -> Probe:
    if _LAST and _LAST[0][0] is ctx:
        return _LAST[0][1]
    probe = Probe(ask_all([u.rstrip("/") for u in etcd_conf(ctx).endpoints]))
    # Members the manifest does not list are asked for their status too (a quorum counts them); their
    # URLs come from the network, so only an http(s)://HOST:PORT one is asked (never file:, never a path).
    from belugactl.dataplane.mds.leadership import parse_endpoints

    asked = {e.url for e in probe.endpoints}
    more = []
    for e in probe.answering:
        for m in e.members or []:
            try:
                urls = parse_endpoints(m.client_urls) if m.client_urls else []
            except ValueError:
                continue
            if urls and not any(u in asked for u in urls):
                more.append(urls[0])
                asked.add(urls[0])
        break  # one member list is the cluster's
    if more:
        probe.extra = {e.url: e for e in ask_all(more[:16], full=False)}
    _LAST[:] = [(ctx, probe)]
    return probe


# --- etcd.reachable ------------------------------------------------------------------------------
@REGISTRY.check("etcd.reachable", "every etcd endpoint of serve.metadata.etcd answers")
def etcd_reachable(ctx: DoctorContext) -> CheckResult:
    if (skip := _skip(ctx)) is not None:
        return skip
    probe = _probe(ctx)
    bad = [e for e in probe.endpoints if e.error]
    good = probe.answering
    versions = sorted({str(e.version.doc.get("etcdserver"))[:32] for e in good if e.version is not None})
    if bad:
        down = "; ".join(f"{e.url}: {e.error}" for e in bad)
        return CheckResult.fail(
            f"{len(bad)} of {len(probe.endpoints)} etcd endpoints do not answer ({down})",
            "start etcd on those hosts (`systemctl start belugactl-etcd.service`, written by `belugactl export "
            f"systemd -f {manifest_arg(ctx)}`), or correct serve.metadata.etcd.endpoints; from this host: "
            f"curl {bad[0].url}/health",
            unreachable=[e.url for e in bad],
        )
    return CheckResult.ok(
        f"{len(good)} endpoint(s) answer (etcd {', '.join(versions) or '?'})", endpoints=[e.url for e in good]
    )


# --- etcd.quorum ---------------------------------------------------------------------------------
@dataclass
class Quorum:
    members: list[Member]
    healthy: list[Member]
    leader: Member | None
    unseen: list[Member]  # no status from them (down, or not reachable from here)


def judge_quorum(members: list[Member], statuses: list[MemberStatus]) -> Quorum:
    by_id = {s.member_id: s for s in statuses if s.member_id}
    healthy = [m for m in members if m.id in by_id and by_id[m.id].leader_id and not by_id[m.id].errors]
    ids = {m.id for m in members}
    leaders = {s.leader_id for s in statuses if s.leader_id in ids and not s.errors}
    leader = next((m for m in members if m.id in leaders), None) if len(leaders) == 1 else None
    return Quorum(members, healthy, leader, [m for m in members if m.id not in by_id])


def _name(m: Member) -> str:
    return m.name or f"id {m.id}"


@REGISTRY.check("etcd.quorum", "the etcd cluster has a leader and a healthy majority")
def etcd_quorum(ctx: DoctorContext) -> CheckResult:
    if (skip := _skip(ctx)) is not None:
        return skip
    probe = _probe(ctx)
    good = probe.answering
    if not good:
        return CheckResult.fail(
            "no etcd endpoint answered, so no quorum could be seen: the metadata servers cannot elect a leader",
            "make etcd reachable first (etcd.reachable names the endpoints)",
        )
    members = next((e.members for e in good if e.members is not None), [])
    statuses = [e.status for e in [*good, *probe.extra.values()] if e.status is not None and not e.error]
    q = judge_quorum(members, statuses)
    n, ok = len(q.members), len(q.healthy)
    need = n // 2 + 1
    facts = {
        "members": [_name(m) for m in q.members],
        "healthy": [_name(m) for m in q.healthy],
        "leader": _name(q.leader) if q.leader else None,
    }
    errors = sorted({err for s in statuses for err in s.errors})
    if q.leader is None or ok < need:
        seen = f"{ok} of {n} members healthy, {need} needed" + (f"; etcd says: {'; '.join(errors)}" if errors else "")
        return CheckResult.fail(
            f"etcd has no quorum ({'no leader' if q.leader is None else 'a leader but'}; {seen}): no lease can be "
            "granted or kept, so no metadata server serves (all answer 503)",
            "start the stopped members (`systemctl start belugactl-etcd.service` on their hosts) until "
            f"{need} of {n} run; a member lost for good: `etcdctl member remove ID` then `member add` on a quorum",
            **facts,
        )
    down = [m for m in q.members if m not in q.healthy]
    text = f"leader {_name(q.leader)}, {ok} of {n} members healthy"
    if down:
        gone = ", ".join(_name(m) + (" (no answer from here)" if m in q.unseen else "") for m in down)
        return CheckResult.warn(
            f"{text}; not healthy: {gone}: one more lost member {'stops' if ok - 1 < need else 'weakens'} the rack",
            "start etcd on those members' hosts (`systemctl start belugactl-etcd.service`)",
            **facts,
        )
    if n < 3:
        return CheckResult.warn(
            f"{text}: {n} member(s) survive no loss of a host (the production shape is three members on three hosts)",
            "run three etcd members on three metadata hosts: list them in serve.metadata.etcd.endpoints and install "
            f"`belugactl export systemd -f {manifest_arg(ctx)} --host HOST` on each",
            **facts,
        )
    return CheckResult.ok(text, **facts)


# --- etcd.clock-skew -----------------------------------------------------------------------------
def skew_bounds(date_header: str, sent_wall: float, rtt_s: float) -> tuple[float, float]:
    """(low, high) of server clock minus local clock, in seconds. The server stamped Date somewhere in
    [sent, sent + rtt] of our clock, and Date drops the fraction: its true time is in [D, D + 1)."""
    parsed = email.utils.parsedate_to_datetime(date_header)
    if parsed is None or parsed.tzinfo is None:
        raise ValueError(f"Date {date_header!r} has no time zone")
    d = parsed.timestamp()
    return d - (sent_wall + rtt_s), d + 1 - sent_wall


def judge_skew(bounds: dict[str, tuple[float, float]], threshold_s: float = SKEW_WARN_S) -> CheckResult:
    def certain_offset(lo: float, hi: float) -> float:  # the smallest |skew| the bounds allow
        return 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))

    rows = {url: (round(lo, 3), round(hi, 3)) for url, (lo, hi) in bounds.items()}
    past = {url: b for url, b in bounds.items() if certain_offset(*b) > threshold_s}
    if past:
        text = "; ".join(f"{url}: {lo:+.1f} s to {hi:+.1f} s" for url, (lo, hi) in past.items())
        return CheckResult.warn(
            f"the clock of etcd differs from this host's by more than {threshold_s:g} s ({text}; server minus local, "
            "from the whole-second HTTP Date)",
            "run time sync on every rack and etcd host (`timedatectl set-ntp true`, or chrony: `chronyc tracking` "
            "shows the offset)",
            skew_s=rows,
        )
    worst = max((certain_offset(*b) for b in bounds.values()), default=0.0)
    return CheckResult.ok(
        f"clocks agree within {threshold_s:g} s (HTTP Date has whole seconds: offsets below 1 s cannot be seen; "
        f"largest certain offset {worst:.1f} s)",
        skew_s=rows,
    )


@REGISTRY.check("etcd.clock-skew", "etcd's clock agrees with this host's", Severity.WARNING)
def etcd_clock_skew(ctx: DoctorContext) -> CheckResult:
    if (skip := _skip(ctx)) is not None:
        return skip
    bounds = {}
    for e in _probe(ctx).answering:
        if e.version is not None and e.version.date:
            try:
                bounds[e.url] = skew_bounds(e.version.date, e.version.sent_wall, e.version.rtt_s)
            except (ValueError, TypeError, OverflowError):
                continue
    if not bounds:
        return CheckResult.skip("no etcd endpoint answered with a Date header (etcd.reachable says which answer)")
    return judge_skew(bounds)


# --- etcd.lease-ttl ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaseFacts:
    ttl_s: float  # serve.metadata.etcd.leader_ttl_s
    granted_s: float  # what etcd granted for it (its minimum lease TTL is 1.5 election timeouts)
    rtt_s: float  # the slowest of grant, keep-alive and a linearizable read, measured now


def elector_timings(ttl_s: float) -> tuple[float, float, float, float]:
    """(margin, keep-alive period, retry period, request timeout) as metadata-server's Elector uses them."""
    return max(0.5, 0.2 * ttl_s), ttl_s / 3, ttl_s / 10, min(1.0, ttl_s / 4)


def judge_lease(f: LeaseFacts) -> CheckResult:
    margin, every, retry, timeout = elector_timings(f.ttl_s)
    window = f.ttl_s - margin  # a keep-alive sent at t proves the term until t + window
    numbers = (
        f"TTL {f.ttl_s:g} s, margin {margin:g} s, keep-alive every {every:.2f} s, request timeout {timeout:.2f} s, "
        f"etcd round trip now {f.rtt_s * 1000:.1f} ms"
    )
    details = {
        "ttl_s": f.ttl_s, "granted_s": f.granted_s, "margin_s": margin, "keepalive_every_s": round(every, 3),
        "request_timeout_s": timeout, "rtt_s": round(f.rtt_s, 4),
    }  # fmt: skip
    raise_ttl = "raise serve.metadata.etcd.leader_ttl_s"
    if every + f.rtt_s >= window or f.rtt_s >= timeout:  # margin >= TTL: window <= 0, caught here too
        why = (
            "the margin is not below the TTL" if margin >= f.ttl_s
            else f"a request takes longer than the {timeout:.2f} s the leader gives it" if f.rtt_s >= timeout
            else f"a keep-alive sent {every:.2f} s into the term answers after its deadline ({window:g} s)"
        )  # fmt: skip
        return CheckResult.fail(
            f"the leader cannot keep its term: {why} ({numbers})",
            f"{raise_ttl} (a keep-alive must come back within TTL - margin - TTL/3), or make etcd answer faster "
            "(its disk: etcd's fsync; the network to it)",
            **details,
        )
    if f.granted_s > f.ttl_s:
        # etcd's minimum lease TTL is ceil(1.5 x its election timeout): so that timeout is above (granted - 1) / 1.5.
        election = (f.granted_s - 1) / 1.5
        against = "longer than" if election >= window else "most of"
        return CheckResult.fail(
            f"etcd grants {f.granted_s:g} s for a {f.ttl_s:g} s lease (its minimum lease TTL, 1.5 times its election "
            f"timeout, which is thus above {election:.1f} s): a dead leader is replaced after {f.granted_s:g} s, not "
            f"{f.ttl_s:g}, and an etcd leader change stalls keep-alives for about that timeout, {against} the "
            f"leader's {window:g} s window ({numbers})",
            f"lower etcd's --election-timeout to at most {f.ttl_s * 1000 / 1.5:.0f} ms on every member, or {raise_ttl} "
            f"to {math.ceil(f.granted_s):d}",
            **details,
        )
    spare = window - every - timeout - retry - f.rtt_s
    if spare <= 0:
        return CheckResult.warn(
            f"one keep-alive lost to a hung endpoint ({timeout:.2f} s) leaves no time for the retry {retry:.2f} s "
            f"later: the leader steps down on one slow etcd request ({numbers})",
            f"{raise_ttl} (5 s leaves {elector_spare(5.0, f.rtt_s):.2f} s spare at this round trip)",
            **details,
        )
    return CheckResult.ok(f"{numbers}: a lost keep-alive and its retry fit with {spare:.2f} s to spare", **details)


def elector_spare(ttl_s: float, rtt_s: float) -> float:
    margin, every, retry, timeout = elector_timings(ttl_s)
    return ttl_s - margin - every - timeout - retry - rtt_s


def measure_lease(url: str, ttl: int, budget_s: float = BUDGET_S) -> LeaseFacts:
    """Grant a lease of `ttl`, keep it alive once, read the leader key's range, revoke: the slowest round trip."""
    deadline = time.monotonic() + budget_s

    def post(path: str, body: dict) -> Answer:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {budget_s:g} s")
        a = http_json(url + path, body, left)
        if a.status != 200 or not isinstance(a.doc, dict):
            raise ValueError(f"{path} answered HTTP {a.status}")
        return a

    grant = post("/v3/lease/grant", {"TTL": ttl, "ID": 0})
    lease, granted = _s(grant.doc.get("ID")), _s(grant.doc.get("TTL"))
    if not lease or not granted:
        raise ValueError(f"the lease grant answered {str(grant.doc)[:200]}")
    try:
        keep = post("/v3/lease/keepalive", {"ID": lease})
        read = post("/v3/kv/range", {"key": base64.b64encode(b"/belugactl/doctor-probe").decode()})
    finally:
        with contextlib.suppress(OSError, ValueError):  # else it lapses by itself within the TTL
            http_json(url + "/v3/kv/lease/revoke", {"ID": lease}, max(0.2, deadline - time.monotonic()))
    return LeaseFacts(float(ttl), float(granted), max(grant.rtt_s, keep.rtt_s, read.rtt_s))


@REGISTRY.check("etcd.lease-ttl", "leader_ttl_s leaves room for the keep-alives at etcd's round trip now")
def etcd_lease_ttl(ctx: DoctorContext) -> CheckResult:
    if (skip := _skip(ctx)) is not None:
        return skip
    good = _probe(ctx).answering
    if not good:
        return CheckResult.skip("no etcd endpoint answered (etcd.reachable says which), so no round trip to time")
    ttl = int(etcd_conf(ctx).leader_ttl_s)
    errors = []
    for e in good:
        try:
            return judge_lease(measure_lease(e.url, ttl))
        except (OSError, ValueError) as exc:
            errors.append(f"{e.url}: {_why(exc)}")
    return CheckResult.fail(
        f"etcd answers but grants or keeps no lease within {BUDGET_S:g} s ({'; '.join(errors)}): a leader could not "
        "keep its term",
        "see etcd.quorum (a cluster without quorum grants nothing) and etcd's log (`journalctl -u belugactl-etcd`)",
    )


# --- etcd.leader ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaderKey:
    member: str
    since: float
    pid: int
    lease: str


def parse_range(doc: Any) -> LeaderKey | None:
    """The leader key from a /v3/kv/range answer; None when absent; ValueError when not a range answer."""
    if not isinstance(doc, dict) or not isinstance(doc.get("header"), dict):
        raise ValueError("not an etcd range answer")
    kvs = doc.get("kvs") or []
    if not isinstance(kvs, list) or not kvs or not isinstance(kvs[0], dict):
        return None
    kv = kvs[0]
    try:
        data = json.loads(base64.b64decode(kv.get("value") or "", validate=True))
        member = str(data["member"])[:128]
        return LeaderKey(member if member.isprintable() else repr(member), float(data.get("since", 0)),
                         int(data.get("pid", 0)), _s(kv.get("lease")))  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        return LeaderKey("?", 0.0, 0, _s(kv.get("lease")))


def judge_leader(key: LeaderKey | None, candidates: list[str], rack: str, fix_serve: str, now: float) -> CheckResult:
    if key is None:
        return CheckResult.warn(
            f"no metadata server holds the leader key of rack {rack}: the rack is not serving (every server "
            "answers 503, or none runs)",
            fix_serve,
        )
    since = f", for {max(0.0, now - key.since):.0f} s" if key.since else ""
    details = {"leader": key.member, "since": key.since, "pid": key.pid, "lease": key.lease}
    if candidates and key.member not in candidates:
        return CheckResult.warn(
            f"{key.member} leads{since}, but is not in serve.metadata.etcd.candidates ({', '.join(candidates)})",
            f"add {key.member} to serve.metadata.etcd.candidates, or stop the metadata server it runs (its lease "
            "is revoked on a clean stop and a candidate takes over)",
            **details,
        )
    return CheckResult.ok(f"{key.member} leads{since} (pid {key.pid} on its host)", **details)


def read_leader(urls: list[str], key: str, budget_s: float = BUDGET_S) -> tuple[LeaderKey | None, list[str]]:
    """The leader key from the first endpoint that answers (a linearizable read); errors otherwise."""
    deadline = time.monotonic() + budget_s
    errors = []
    body = {"key": base64.b64encode(key.encode()).decode()}
    for url in urls:
        left = deadline - time.monotonic()
        if left <= 0.05:
            errors.append(f"{url}: not asked, {budget_s:g} s spent")
            continue
        try:
            a = http_json(url + "/v3/kv/range", body, left)
            if a.status != 200:
                raise ValueError(f"HTTP {a.status}: {str(a.doc)[:200]}")
            return parse_range(a.doc), []
        except (OSError, ValueError) as exc:
            errors.append(f"{url}: {_why(exc)}")
    return None, errors


@REGISTRY.check("etcd.leader", "a candidate holds the metadata leader key", Severity.WARNING)
def etcd_leader(ctx: DoctorContext) -> CheckResult:
    from belugactl.dataplane.mds.leadership import leader_key

    if (skip := _skip(ctx)) is not None:
        return skip
    good = _probe(ctx).answering
    if not good:
        return CheckResult.skip("no etcd endpoint answered (etcd.reachable says which), so no leader key to read")
    m = ctx.expect.manifest  # type: ignore[union-attr]
    key, errors = read_leader([e.url for e in good], leader_key(m.name))
    if errors:
        return CheckResult.fail(
            f"cannot read the leader key {leader_key(m.name)} ({'; '.join(errors)}): a standby could not either",
            "see etcd.quorum (reads need a quorum)",
        )
    conf = etcd_conf(ctx)
    fix = (
        f"start the elected metadata servers: `belugactl metadata-server -f {manifest_arg(ctx)} --standby --member "
        f"HOST` on each of {', '.join(conf.candidates) or 'the metadata hosts'}; if they run, their /readyz and "
        "log say why none campaigns (etcd.lease-ttl, etcd.quorum)"
    )
    return judge_leader(key, list(conf.candidates), m.name, fix, time.time())
