"""The check registry: every check is a small named object with a stable id.

Ids are `topic.name` in kebab case (`dax.mode-devdax`); they are a public interface (`--ignore`,
`--json`, runbooks), so never rename one; add a new id instead.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from belugactl.workflows.doctor.result import CheckResult, Severity

if TYPE_CHECKING:
    from belugactl.workflows.doctor.context import DoctorContext

CheckFunc = Callable[["DoctorContext"], CheckResult]

# The report's order of topics: from what the host has (tools, kernel, CXL) to how it is tuned.
TOPIC_ORDER = (
    "tools",
    "kernel",
    "cxl",
    "dax",
    "numa",
    "memory",
    "hugepages",
    "thp",
    "ddio",
    "mtrr",
    "gpu",
    "pci",
    "pool",
)

_ID_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    severity: Severity
    func: CheckFunc
    # A check whose failure means the pool's data is lost or about to be: doctor never suggests
    # `--ignore` for it (the summary's hint names another check, or none).
    guards_data: bool = False

    @property
    def topic(self) -> str:
        return self.id.split(".", 1)[0]

    def run(self, ctx: DoctorContext) -> CheckResult:
        return self.func(ctx)


class Registry:
    """An ordered set of checks; order of registration is the order of the report."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, check: Check) -> None:
        if not _ID_RE.match(check.id):
            raise ValueError(f"check id {check.id!r} is not `topic.kebab-name`")
        if check.id in self._checks:
            raise ValueError(f"check id {check.id!r} registered twice")
        self._checks[check.id] = check

    def check(
        self, id: str, title: str, severity: Severity = Severity.ERROR, *, guards_data: bool = False
    ) -> Callable[[CheckFunc], CheckFunc]:
        """Decorator registering `func(ctx) -> CheckResult` under a stable id."""

        def register(func: CheckFunc) -> CheckFunc:
            self.add(Check(id, title, severity, func, guards_data))
            return func

        return register

    def __iter__(self) -> Iterator[Check]:
        """Checks grouped by topic in TOPIC_ORDER (others last), in registration order within a topic."""
        rank = {topic: i for i, topic in enumerate(TOPIC_ORDER)}
        return iter(sorted(self._checks.values(), key=lambda c: rank.get(c.topic, len(rank))))

    def __len__(self) -> int:
        return len(self._checks)

    def __contains__(self, id: object) -> bool:
        return id in self._checks

    def get(self, id: str) -> Check | None:
        return self._checks.get(id)

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self]

    def suggest(self, name: str) -> list[str]:
        """Known ids close to a mistyped one, best first (did-you-mean)."""
        ids = self.ids
        close = difflib.get_close_matches(name, ids, n=3, cutoff=0.6)
        if close:
            return close
        # `--ignore ddio` or `--ignore lockdown`: match a bare topic or name part.
        return [i for i in ids if name in i.split(".")][:3]


# The built-in checks register themselves here when `belugactl.workflows.doctor.checks` is imported.
REGISTRY = Registry()
