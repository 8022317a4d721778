"""What a rack command found, host by host and problem by problem: the summary every rack view starts with.

Each host is in exactly one state: ok, failing (a check, the version skew, the pool probe or the command
itself failed there), unreachable (the transport never reached it: nothing was checked) or not run (an
earlier phase failed). Each problem is listed once with every host it is on (a node set when rendered);
hosts that report it in different words are its variants.

Exit status (`exit_code`): 1 when any host is failing, else 3 when any host is unreachable, else 0. A
problem found outranks a host not checked, as in `doctor` (1 for a failed check before 3 for no CXL).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from belugactl.errors import ExitCode
from belugactl.workflows.rack.fanout import fold
from belugactl.workflows.rack.reach import Unreachable

if TYPE_CHECKING:
    from belugactl.workflows.rack.orchestrate import RackDoctorReport, RackRun

PROBE_FIX = (
    "check that this host maps the same device and namespace as the others (belugactl doctor; belugactl pool show)"
)
HOST_PLACEHOLDER = "<host>"  # in a wording several hosts share: each host's own name
COMMAND_FIX = "run the same command on the host by hand (belugactl ... --json) to see the whole error"


@dataclass(frozen=True)
class Variant:
    """One wording of a problem and the hosts that report it so."""

    hosts: list[str]
    reason: str
    fix: str | None = None
    detail: tuple[str, ...] = ()  # the command's last stderr lines, when it failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts,
            "node_set": fold(self.hosts),
            "reason": self.reason,
            "fix": self.fix,
            "detail": list(self.detail),
        }


@dataclass(frozen=True)
class Finding:
    """A problem (a check id, `version.skew`, `pool.probe`, or the command's name) and every host it is on."""

    id: str
    status: str  # "fail" or "warn"
    variants: list[Variant]

    @property
    def hosts(self) -> list[str]:
        return [h for v in self.variants for h in v.hosts]

    def to_dict(self, order: list[str]) -> dict[str, Any]:
        hosts = [h for h in order if h in set(self.hosts)]
        return {
            "id": self.id,
            "status": self.status,
            "hosts": hosts,
            "node_set": fold(hosts),
            "variants": [v.to_dict() for v in self.variants],
        }


@dataclass
class RackSummary:
    verb: str
    hosts: list[str]
    failing: list[str]
    unreachable: dict[str, Unreachable]
    not_run: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    outcomes: dict[str, list[str]] = field(default_factory=dict)  # what the ok hosts did: outcome -> hosts

    @property
    def ok(self) -> list[str]:
        bad = set(self.failing) | set(self.unreachable) | set(self.not_run)
        return [h for h in self.hosts if h not in bad]

    @property
    def exit_code(self) -> int:
        if self.failing or (self.not_run and not self.unreachable):
            return int(ExitCode.FAILED)
        if self.unreachable:
            return int(ExitCode.ENVIRONMENT)
        return int(ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "hosts": len(self.hosts),
            "ok": self.ok,
            "failing": self.failing,
            "unreachable": [h for h in self.hosts if h in self.unreachable],
            "not_run": self.not_run,
            "unreachable_why": {h: self.unreachable[h].to_dict() for h in self.hosts if h in self.unreachable},
            "findings": [f.to_dict(self.hosts) for f in self.findings],
            "outcomes": self.outcomes,
        }


class _Findings:
    """Collects (id, status, host, reason, fix) and groups them: one finding per id, one variant per wording.

    Wordings that differ only by the host's own name (`--host beluga-03`) are one variant, the name
    written `<host>`; a variant of one host keeps its name."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, str], dict[tuple[str, str | None, tuple[str, ...]], list[_Said]]] = {}

    def add(
        self, id: str, status: str, host: str, reason: str, fix: str | None = None, detail: Iterable[str] = ()
    ) -> None:
        said = _Said(host, reason, fix, tuple(detail))
        variants = self._by_id.setdefault((id, status), {})
        variants.setdefault(said.anonymous(), []).append(said)

    def findings(self, order: list[str]) -> list[Finding]:
        rank = {h: i for i, h in enumerate(order)}
        out = []
        for (id, status), variants in self._by_id.items():
            merged = []
            for words, said in variants.items():
                hosts = sorted((s.host for s in said), key=rank.__getitem__)
                reason, fix, detail = words if len(said) > 1 else (said[0].reason, said[0].fix, said[0].detail)
                merged.append(Variant(hosts, reason, fix, detail))
            out.append(Finding(id, status, merged))
        return sorted(out, key=lambda f: f.status != "fail")  # failures first, each kind in the order found


@dataclass(frozen=True)
class _Said:
    host: str
    reason: str
    fix: str | None
    detail: tuple[str, ...]

    def anonymous(self) -> tuple[str, str | None, tuple[str, ...]]:
        """The words with this host's own name as `<host>` (a longer name that contains it is left alone)."""
        name = re.compile(rf"(?<![\w.-]){re.escape(self.host)}(?![\w-])(?!\.\w)")

        def anon(text: str) -> str:
            return name.sub(HOST_PLACEHOLDER, text)

        return anon(self.reason), anon(self.fix) if self.fix else self.fix, tuple(anon(d) for d in self.detail)


def doctor_summary(report: RackDoctorReport) -> RackSummary:
    away = set(report.unreachable)
    found = _Findings()
    for host, text in report.host_errors.items():
        if host not in away:
            found.add("belugactl", "fail", host, text, COMMAND_FIX)
    for host, row in report.skew.items():
        if host not in away and row.get("status") != "ok":
            found.add("version.skew", "fail", host, row.get("reason") or "", row.get("fix"))
    for check_id, cells in report.checks.items():
        for host, cell in cells.items():
            if cell.get("status") in ("fail", "warn"):
                found.add(check_id, cell["status"], host, cell.get("reason") or "", cell.get("fix"))
    for host, text in report.probe_errors.items():
        if host not in away:
            found.add("pool.probe", "fail", host, text, PROBE_FIX)
    for reader, cells in (report.probe or {}).items():
        for writer, cell in cells.items():
            if cell["status"] != "ok" and writer not in report.probe_errors:
                found.add(
                    "pool.probe",
                    "fail",
                    reader,
                    f"{cell['status']} reading {writer}'s probe: {cell['detail']}",
                    PROBE_FIX,
                )
    failing = [h for h in report.failed_hosts if h not in away]
    return RackSummary("doctor", report.hosts, failing, dict(report.unreachable), findings=found.findings(report.hosts))


def run_summary(run: RackRun) -> RackSummary:
    away = set(run.unreachable)
    found = _Findings()
    for host in run.hosts:
        res = run.results.get(host)
        if host in away or res is None or (res.ok and host not in run.problems):
            continue
        detail = res.stderr.strip().splitlines()[-6:]
        found.add(run.verb, "fail", host, run.problems.get(host) or f"exit {res.returncode}", _hint(res.stdout), detail)
    failing = [h for h in run.failed_hosts if h not in away and h not in run.not_run]
    outcomes: dict[str, list[str]] = {}
    for host in run.hosts:
        if host not in run.failed_hosts and host in run.documents:
            outcomes.setdefault(outcome(run.verb, run.documents[host]), []).append(host)
    return RackSummary(
        run.verb, run.hosts, failing, dict(run.unreachable), list(run.not_run), found.findings(run.hosts), outcomes
    )


def outcome(verb: str, doc: Any) -> str:
    """What one host's command did, in a few words (hosts that did the same are shown together)."""
    if not isinstance(doc, dict):
        return "ok"
    if verb == "setup":
        report = doc.get("report", doc)
        if report.get("dry_run"):
            planned = len(report.get("remaining", []))
            return f"{planned} step(s) planned" if planned else "nothing to do"
        applied = len(report.get("applied", []))
        return f"{applied} step(s) applied" if applied else "no changes"
    if verb == "status":
        return str(doc.get("state") or ("running" if doc.get("running") else "not running"))
    if verb == "stop":
        return "nothing was running" if doc.get("nothing_running") else f"stopped {len(doc.get('stopped', []))}"
    if verb in ("serve", "serve --rolling"):
        return "planned" if "processes" in doc and "state" not in doc else str(doc.get("state", "started"))
    return "ok"


def _hint(stdout: str) -> str | None:
    """The fix in a per-host command's --json error document, if it printed one."""
    import json

    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    return error.get("hint") if isinstance(error, dict) else None
