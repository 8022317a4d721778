"""Rack-wide setup, doctor, serve, status and stop: the per-host commands, fanned out in order.

Ordering rules (why they exist):
- setup: the first selected host provisions alone, so it is the one that writes the pool header;
  the others then only verify it (the header claim protocol would also cope, but an operator
  reading the matrix should see one writer, not a race).
- serve: the metadata server's host first (workers connect to it at start); stop: it goes last.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.errors import UsageError
from belugactl.workflows.rack.fanout import NodeResult, NoProgress, Progress, Transport, fan_out
from belugactl.workflows.rack.reach import Unreachable, explain
from belugactl.workflows.rack.summary import RackSummary, doctor_summary, run_summary

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext

CheckCell = dict[str, Any]


@dataclass
class RackTarget:
    rack: RackContext  # the manifest, loaded once here
    hosts: list[str]
    transport: Transport
    remote_belugactl: list[str] = field(default_factory=lambda: ["belugactl"])
    remote_manifest: str | None = None
    fanout: int = 16
    timeout_s: float = 600.0
    pool: str | None = None  # --pool, passed on to every host (each decides its own device otherwise)
    progress: Progress = field(default_factory=NoProgress)

    @property
    def manifest_path(self) -> str:
        return self.rack.file

    @property
    def manifest(self) -> Any:
        return self.rack.manifest

    @property
    def rmanifest(self) -> str:
        return self.remote_manifest or self.manifest_path

    def cmd(self, *args: str) -> list[str]:
        return [*self.remote_belugactl, *args]

    def run(self, hosts: Sequence[str], argv_for: Callable[[str], list[str]], *, phase: str) -> dict[str, NodeResult]:
        """`argv_for(host)` on every host; `phase` names this fan-out in the progress."""
        if not hosts:
            return {}
        self.progress.phase(phase, hosts)
        return fan_out(
            list(hosts),
            argv_for,
            self.transport,
            fanout=self.fanout,
            timeout_s=self.timeout_s,
            on_result=lambda result: self.progress.answered(phase, result),
        )

    def unreachable(self, results: dict[str, NodeResult]) -> dict[str, Unreachable]:
        return {h: explain(r, self.transport) for h, r in results.items() if r.unreachable}

    @property
    def metadata_host(self) -> str | None:
        serve = getattr(self.manifest, "serve", None)
        meta = getattr(getattr(serve, "metadata", None), "host", None)
        if meta:
            return meta
        for h in self.manifest.hosts:
            if "metadata" in h.roles:
                return h.name
        return None


def select_hosts(manifest: Any, selection: str | None) -> list[str]:
    """Hosts in manifest order; `selection` is a ClusterShell node set (lab-[1-2], gpu[01-16])."""
    names = [h.name for h in manifest.hosts]
    if not selection:
        return names
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        wanted = set(NodeSet(selection))
    except NodeSetParseError as exc:
        raise UsageError(f"--hosts {selection!r} is not a node set: {exc}", fix="e.g. --hosts lab-[1-2]") from None
    unknown = sorted(wanted - set(names))
    if unknown:
        raise UsageError(
            f"--hosts names hosts that are not in the manifest: {', '.join(unknown)}",
            fix=f"the manifest lists: {', '.join(names)}",
        )
    return [n for n in names if n in wanted]


def parse_json(result: NodeResult) -> tuple[Any | None, str | None]:
    """The JSON document a per-host command printed, or why there is none."""
    if result.unreachable:
        return None, "unreachable: " + (result.stderr.strip().splitlines() or ["ssh failed"])[-1]
    if result.timed_out:
        return None, "timed out"
    text = result.stdout.strip()
    if not text:
        err = result.stderr.strip().splitlines()
        return None, f"exit {result.returncode}: " + (err[0] if err else "no output")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None, f"exit {result.returncode}: output is not JSON: {text.splitlines()[0][:120]}"
    if isinstance(doc, dict) and doc.get("ok") is False and isinstance(doc.get("error"), dict):
        return None, f"exit {result.returncode}: {doc['error'].get('message')}"  # --json's error document
    return doc, None


def host_problem(result: NodeResult) -> str | None:
    _, problem = parse_json(result)
    return problem


# --- doctor -------------------------------------------------------------------------------------


@dataclass
class RackDoctorReport:
    hosts: list[str]
    skew: dict[str, dict[str, Any]]
    checks: dict[str, dict[str, CheckCell]]  # check id -> host -> cell
    check_titles: dict[str, str]
    host_errors: dict[str, str]
    probe: dict[str, dict[str, dict[str, Any]]] | None  # reader -> writer -> {status, detail}
    probe_errors: dict[str, str]
    local: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase: info, doctor, probe
    unreachable: dict[str, Unreachable] = field(default_factory=dict)  # never reached: nothing checked

    @property
    def failed_hosts(self) -> list[str]:
        bad = set(self.host_errors)
        bad |= {h for h, row in self.skew.items() if row.get("status") != "ok"}
        for cells in self.checks.values():
            bad |= {h for h, c in cells.items() if c.get("status") == "fail"}
        if self.probe is not None:
            bad |= set(self.probe_errors)
            bad |= self._probe_suspects()
        return [h for h in self.hosts if h in bad]

    def _probe_suspects(self) -> set[str]:
        """Who is wrong when a probe is not seen: the majority decides; with no majority, both."""
        assert self.probe is not None
        readers = list(self.probe)

        def col_ok(writer: str) -> float:
            seen = [self.probe[r].get(writer, {}).get("status") == "ok" for r in readers]
            return sum(seen) / len(seen) if seen else 0.0

        def row_ok(reader: str) -> float:
            row = {w: c for w, c in self.probe[reader].items() if w not in self.probe_errors}
            return sum(c["status"] == "ok" for c in row.values()) / len(row) if row else 0.0

        suspects: set[str] = set()
        for reader, row in self.probe.items():
            for writer, cell in row.items():
                if cell["status"] == "ok" or writer in self.probe_errors:
                    continue  # a writer that could not write is blamed on its own
                if col_ok(writer) > 0.5:
                    suspects.add(reader)
                elif row_ok(reader) > 0.5:
                    suspects.add(writer)
                else:
                    suspects |= {reader, writer}
        return suspects

    @property
    def failed(self) -> bool:
        return bool(self.failed_hosts)

    def summary(self) -> RackSummary:
        return doctor_summary(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary().to_dict(),
            "hosts": self.hosts,
            "failed": self.failed,
            "failed_hosts": self.failed_hosts,
            "unreachable_or_broken": self.host_errors,
            "version_skew": self.skew,
            "local": self.local,
            "checks": self.checks,
            "probe": {"matrix": self.probe, "errors": self.probe_errors} if self.probe is not None else None,
            "timings_s": self.timings,
        }


def _skew(target: RackTarget, infos: dict[str, NodeResult]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    from belugactl.workflows.rack.host_tasks import host_info

    local = host_info(target.rack)
    rows: dict[str, dict[str, Any]] = {}
    for host, res in infos.items():
        doc, problem = parse_json(res)
        if doc is None:
            rows[host] = {"status": "fail", "reason": problem, "fix": "make belugactl and the manifest reachable"}
            continue
        diffs = []
        if doc.get("belugactl_version") != local["belugactl_version"]:
            diffs.append(f"belugactl {doc.get('belugactl_version')} (here {local['belugactl_version']})")
        if doc.get("manifest_sha256") != local["manifest_sha256"]:
            diffs.append("manifest differs from this one")
        if doc.get("layout_hash") != local["layout_hash"]:
            diffs.append("pool layout differs")
        rows[host] = {
            **doc,
            "status": "fail" if diffs else "ok",
            "reason": "; ".join(diffs) if diffs else "same belugactl and manifest",
            "fix": (
                f"install belugactl {local['belugactl_version']} and copy this manifest to {target.rmanifest} on {host}"
            )
            if diffs
            else None,
        }
    return rows, local


def rack_doctor(
    target: RackTarget, *, ignore: Sequence[str] = (), probe: bool = True, checks: bool = True
) -> RackDoctorReport:
    hosts = target.hosts
    timings: dict[str, float] = {}
    clock = time.monotonic()
    infos = target.run(
        hosts, lambda h: target.cmd("rack", "agent", "info", "-f", target.rmanifest, "--host", h), phase="info"
    )
    timings["info"] = time.monotonic() - clock
    skew, local = _skew(target, infos)
    unreachable = target.unreachable(infos)
    host_errors = {h: p for h, r in infos.items() if (p := host_problem(r)) and (r.unreachable or r.timed_out)}
    ignore_args = [a for name in ignore for a in ("--ignore", name)]
    live = [h for h in hosts if h not in host_errors] if checks else []
    clock = time.monotonic()
    doctors = target.run(
        live,
        lambda h: target.cmd("doctor", "-f", target.rmanifest, "--host", h, "--json", *ignore_args),
        phase="doctor",
    )
    timings["doctor"] = time.monotonic() - clock
    unreachable |= target.unreachable(doctors)
    cells: dict[str, dict[str, CheckCell]] = {}
    titles: dict[str, str] = {}
    for host, res in doctors.items():
        doc, problem = parse_json(res)
        if doc is None or "checks" not in doc:
            host_errors[host] = problem or "doctor printed no checks"
            continue
        for check in doc["checks"]:
            titles.setdefault(check["id"], check.get("title", check["id"]))
            cells.setdefault(check["id"], {})[host] = {
                "status": check.get("status"),
                "reason": check.get("reason"),
                "fix": check.get("fix"),
                "ignored": check.get("ignored", False),
            }
    matrix = None
    probe_errors: dict[str, str] = {}
    if probe:
        clock = time.monotonic()
        matrix, probe_errors = run_probe(target, [h for h in hosts if h not in host_errors])
        timings["probe"] = time.monotonic() - clock
    report = RackDoctorReport(hosts, skew, cells, titles, host_errors, matrix, probe_errors, local)
    report.timings = {k: round(v, 3) for k, v in timings.items()}
    report.unreachable = unreachable
    return report


def run_probe(target: RackTarget, hosts: list[str]) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
    nonce = secrets.randbits(63) | 1
    pool_args = ["--pool", target.pool] if target.pool else []
    common = ["-f", target.rmanifest, "--nonce", str(nonce), *pool_args, "--json"]
    errors: dict[str, str] = {}
    writes = target.run(
        hosts, lambda h: target.cmd("rack", "agent", "probe-write", "--host", h, *common), phase="probe-write"
    )
    for host, res in writes.items():
        problem = host_problem(res)
        if problem:
            errors[host] = f"probe write failed: {problem}"
    reads = target.run(
        hosts, lambda h: target.cmd("rack", "agent", "probe-read", "--host", h, *common), phase="probe-read"
    )
    matrix: dict[str, dict[str, dict[str, Any]]] = {}
    for host, res in reads.items():
        doc, problem = parse_json(res)
        if doc is None or "seen" not in doc:
            errors.setdefault(host, f"probe read failed: {problem}")
            continue
        # only the hosts asked to write: one never reached wrote nothing, and that is not the reader's fault
        matrix[host] = {w: doc["seen"][w] for w in hosts if w in doc["seen"]}
    return matrix, errors


# --- setup / serve / status / stop --------------------------------------------------------------


@dataclass
class RackRun:
    verb: str
    hosts: list[str]
    order: list[list[str]]
    results: dict[str, NodeResult]
    documents: dict[str, Any]
    problems: dict[str, str]
    not_run: list[str]
    unreachable: dict[str, Unreachable] = field(default_factory=dict)

    @property
    def failed_hosts(self) -> list[str]:
        bad = set(self.problems) | {h for h, r in self.results.items() if not r.ok} | set(self.not_run)
        return [h for h in self.hosts if h in bad]

    @property
    def failed(self) -> bool:
        return bool(self.failed_hosts)

    def summary(self) -> RackSummary:
        return run_summary(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary().to_dict(),
            "verb": self.verb,
            "hosts": self.hosts,
            "order": self.order,
            "failed": self.failed,
            "failed_hosts": self.failed_hosts,
            "not_run": self.not_run,
            **({"metadata_servers": metadata_servers(self)} if self.verb == "status" else {}),
            "per_host": {
                h: {
                    "returncode": self.results[h].returncode if h in self.results else None,
                    "duration_s": round(self.results[h].duration_s, 3) if h in self.results else None,
                    "problem": self.problems.get(h),
                    "result": self.documents.get(h),
                    "stderr": self.results[h].stderr if h in self.results else None,
                }
                for h in self.hosts
            },
        }


def _phased(
    target: RackTarget,
    verb: str,
    phases: list[list[str]],
    argv_for: Callable[[str], list[str]],
    *,
    stop_on_failure: bool,
) -> RackRun:
    results: dict[str, NodeResult] = {}
    docs: dict[str, Any] = {}
    problems: dict[str, str] = {}
    not_run: list[str] = []
    phases = [p for p in phases if p]
    for i, phase in enumerate(phases):
        if stop_on_failure and any(not r.ok for r in results.values()):
            not_run.extend(h for p in phases[i:] for h in p)
            break
        for host, res in target.run(phase, argv_for, phase=verb).items():
            results[host] = res
            doc, problem = parse_json(res)
            if doc is not None:
                docs[host] = doc
            if problem or not res.ok:
                problems[host] = problem or f"exit {res.returncode}"
    return RackRun(verb, target.hosts, phases, results, docs, problems, not_run, target.unreachable(results))


def rack_setup(target: RackTarget, *, dry_run: bool, force: bool) -> RackRun:
    flags = ["--json", "--yes"] + (["--dry-run"] if dry_run else []) + (["--force"] if force else [])
    first, rest = target.hosts[:1], target.hosts[1:]
    return _phased(
        target,
        "setup",
        [first, rest],
        lambda h: target.cmd("setup", "-f", target.rmanifest, "--host", h, *flags),
        stop_on_failure=not dry_run,
    )


def _metadata_first(target: RackTarget) -> list[list[str]]:
    """The host whose metadata server leads first (serve.metadata.etcd.candidates[0], else the metadata
    host), then the rest: elected standbys come up beside the workers and find a leader to name. When
    serve runs etcd (serve.metadata.etcd.run), every etcd member and candidate host first, together."""
    meta = target.metadata_host
    conf = getattr(getattr(getattr(target.manifest, "serve", None), "metadata", None), "etcd", None)
    if conf is not None and getattr(conf, "run", False):
        # serve runs etcd: its members (and the candidates that campaign in it) start together, as
        # no member answers before a majority of them runs.
        from belugactl.workflows.setup.systemd import etcd_members

        first = {h for _n, h, _c, _p in etcd_members(target.manifest) if h} | set(conf.candidates)
        phase = [h for h in target.hosts if h in first]
        if phase:
            return [phase, [h for h in target.hosts if h not in first]] if len(phase) < len(target.hosts) else [phase]
    if conf is not None and conf.candidates:
        meta = conf.candidates[0]
    if meta in target.hosts:
        return [[meta], [h for h in target.hosts if h != meta]]
    return [target.hosts]


def rack_serve(target: RackTarget, *, dry_run: bool, extra: Sequence[str] = ()) -> RackRun:
    flags = ["--json"] + (["--dry-run"] if dry_run else ["--detach"]) + list(extra)
    if target.pool:
        flags += ["--pool", target.pool]
    return _phased(
        target,
        "serve",
        _metadata_first(target),
        lambda h: target.cmd("serve", "-f", target.rmanifest, "--host", h, *flags),
        stop_on_failure=not dry_run,
    )


def rolling_order(target: RackTarget, status: RackRun) -> list[str]:
    """The hosts one at a time for `rack serve --rolling`: those whose metadata server does not lead
    (or that run none) first, then the leading one (it resigns as it stops, and a standby restarted
    before it takes over, warm), then the front door's hosts (a router's restart is the one the
    traffic sees: with two router hosts the clients' other address carries it)."""
    from belugactl.workflows.serve.router import router_hosts

    leading = {r["host"] for r in metadata_servers(status) if r["role"] in ("leader", "serves")}
    doors = set(router_hosts(target.manifest))
    last = [h for h in target.hosts if h in leading and h not in doors] + [h for h in target.hosts if h in doors]
    return [h for h in target.hosts if h not in last] + last


def rack_serve_rolling(target: RackTarget, *, dry_run: bool, extra: Sequence[str] = ()) -> RackRun:
    """Restart (or upgrade: a new belugactl or vLLM installed first) one host at a time: stop, serve
    again, and only when that host is ready the next one. The pool, its index and the journal stay;
    a host that fails to come back stops the roll (the rest are not touched: `not_run`)."""
    status = rack_status(target)
    order = rolling_order(target, status)
    flags = ["--json"] + (["--dry-run"] if dry_run else ["--detach"]) + list(extra)
    if target.pool:
        flags += ["--pool", target.pool]
    results: dict[str, NodeResult] = {}
    docs: dict[str, Any] = {}
    problems: dict[str, str] = {}
    not_run: list[str] = []
    for i, host in enumerate(order):
        if not dry_run:
            stopped = target.run([host], lambda h: target.cmd("stop", "--json"), phase=f"rolling {host}: stop")
            res = stopped[host]
            if res.unreachable or res.returncode not in (0, None):
                results[host], problems[host] = res, f"stop failed (exit {res.returncode})"
                not_run.extend(order[i + 1 :])
                break
        served = target.run(
            [host],
            lambda h: target.cmd("serve", "-f", target.rmanifest, "--host", h, *flags),
            phase=f"rolling {host}: serve",
        )
        res = results[host] = served[host]
        doc, problem = parse_json(res)
        if doc is not None:
            docs[host] = doc
        if problem or not res.ok:
            problems[host] = problem or f"exit {res.returncode}"
            if not dry_run:
                not_run.extend(order[i + 1 :])
                break
    return RackRun(
        "serve --rolling", target.hosts, [[h] for h in order], results, docs, problems, not_run,
        target.unreachable(results),
    )  # fmt: skip


def metadata_servers(run: RackRun) -> list[dict[str, Any]]:
    """Per host whose `status` read a metadata server's /stats: its role (leader, standby, or a plain
    server), who it says leads, since when (Unix time), the leader changes it saw, its epoch; in host order."""
    rows = []
    for host in run.hosts:
        doc = run.documents.get(host)
        pool = doc.get("pool") if isinstance(doc, dict) else None
        if not isinstance(pool, dict):
            continue
        elected = pool.get("leader") is not None or pool.get("member") is not None
        if not elected:
            role = "serves" if pool.get("ready") else "not ready"
        else:
            role = "leader" if pool.get("leading") else "standby"
        rows.append(
            {
                "host": host,
                "role": role,
                "member": pool.get("member"),
                "leader": pool.get("leader") if elected else host,
                "leader_since": pool.get("leader_since"),
                "leader_changes": pool.get("leader_changes"),
                "epoch": pool.get("epoch"),
            }
        )
    return rows


def rack_status(target: RackTarget) -> RackRun:
    return _phased(target, "status", [target.hosts], lambda h: target.cmd("status", "--json"), stop_on_failure=False)


def rack_stop(target: RackTarget) -> RackRun:
    phases = list(reversed(_metadata_first(target)))
    return _phased(target, "stop", phases, lambda h: target.cmd("stop", "--json"), stop_on_failure=False)
