"""What one check says about a host, and what the whole run says."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    @property
    def symbol(self) -> str:
        return _SYMBOLS[self]


_SYMBOLS = {Status.OK: "✓", Status.WARN: "!", Status.FAIL: "✗", Status.SKIP: "-"}


class Severity(StrEnum):
    """How bad a problem found by a check is: `error` problems fail the run, `warning` ones only warn."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: a status, a one-line reason, and the exact fix when it is not ok.

    `details` holds the facts behind the reason (device names, register values) for `--json` and `-v`.
    """

    status: Status
    reason: str
    fix: str | None = None
    details: dict[str, object] = field(default_factory=dict)

    @classmethod
    def ok(cls, reason: str, **details: object) -> CheckResult:
        return cls(Status.OK, reason, None, details)

    @classmethod
    def warn(cls, reason: str, fix: str | None = None, **details: object) -> CheckResult:
        return cls(Status.WARN, reason, fix, details)

    @classmethod
    def fail(cls, reason: str, fix: str | None = None, **details: object) -> CheckResult:
        return cls(Status.FAIL, reason, fix, details)

    @classmethod
    def skip(cls, reason: str, *, fix: str | None = None, **details: object) -> CheckResult:
        return cls(Status.SKIP, reason, fix, details)


@dataclass(frozen=True)
class CheckOutcome:
    """A check's result as reported: the check's identity plus the (possibly downgraded) result."""

    id: str
    title: str
    topic: str
    result: CheckResult
    severity: str = "error"  # the check's severity: "warning" checks never fail the run
    # True when the check failed but `--ignore` downgraded it to a warning.
    ignored: bool = False
    # True when the check itself raised; the result is then a failure carrying the error.
    crashed: bool = False
    # True for a check guarding the pool's data: never offered to `--ignore` in the summary's hint.
    guards_data: bool = False

    @property
    def status(self) -> Status:
        return self.result.status

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "topic": self.topic,
            "severity": self.severity,
            "status": self.result.status.value,
            "reason": self.result.reason,
            "fix": self.result.fix,
            "ignored": self.ignored,
            "crashed": self.crashed,
            "guards_data": self.guards_data,
            "details": self.result.details,
        }


@dataclass(frozen=True)
class DoctorReport:
    hostname: str
    host_entry: str | None  # the manifest's host this machine was checked against, if any
    manifest: str | None  # the manifest file, if any
    outcomes: tuple[CheckOutcome, ...]
    notes: tuple[str, ...] = ()  # context for the reader, e.g. "no CXL on this host"
    # False when the host has no CXL bus, memory devices or adapters: the CXL checks had nothing to check.
    has_cxl: bool = True

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status is status)

    @property
    def failed(self) -> bool:
        return self.count(Status.FAIL) > 0

    @property
    def exit_code(self) -> int:
        return self.exit_code_for()

    def exit_code_for(self, *, allow_no_cxl: bool = False) -> int:
        """1 when a check failed; 3 when nothing failed but the host has no CXL to check (a health
        check that checked nothing is not a pass), unless `allow_no_cxl`; else 0."""
        from belugactl.errors import ExitCode

        if self.failed:
            return int(ExitCode.FAILED)
        if not self.has_cxl and not allow_no_cxl:
            return int(ExitCode.ENVIRONMENT)
        return int(ExitCode.OK)

    def summary(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in Status}

    def to_dict(self) -> dict[str, object]:
        return {
            "schema_version": 1,
            "hostname": self.hostname,
            "host_entry": self.host_entry,
            "manifest": self.manifest,
            "summary": self.summary(),
            "failed": self.failed,
            "has_cxl": self.has_cxl,
            "notes": list(self.notes),
            "checks": [o.to_dict() for o in self.outcomes],
        }
