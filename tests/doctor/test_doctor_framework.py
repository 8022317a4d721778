"""The registry, the runner (crashes, severities, --ignore) and the report."""

from __future__ import annotations

import pytest

from belugactl.errors import ExitCode, UsageError
from belugactl.workflows.doctor import (
    CheckResult,
    DoctorReport,
    Registry,
    Severity,
    Status,
    builtin_registry,
    run_checks,
    validate_ignores,
)
from belugactl.workflows.doctor.registry import TOPIC_ORDER, Check
from tests.support.doctor_snapshots import beluga_like, ctx, nocxl


def tiny_registry() -> Registry:
    reg = Registry()
    reg.add(Check("tools.fine", "fine", Severity.ERROR, lambda c: CheckResult.ok("fine")))
    reg.add(Check("tools.broken", "broken", Severity.ERROR, lambda c: CheckResult.fail("broken", "fix it")))
    reg.add(Check("tools.crashes", "crashes", Severity.ERROR, lambda c: {}["missing"]))
    reg.add(Check("tools.soft", "soft", Severity.WARNING, lambda c: CheckResult.fail("soft problem", "soft fix")))
    return reg


def test_builtin_registry_has_at_least_20_checks_with_stable_ids():
    reg = builtin_registry()
    ids = reg.ids
    assert len(ids) >= 20
    assert len(set(ids)) == len(ids)
    for required in (
        "tools.ndctl-version",
        "cxl.memdevs-present",
        "dax.mode-devdax",
        "dax.align",
        "numa.cxl-node-cpuless",
        "hugepages.per-node",
        "thp.mode",
        "ddio.disabled",
        "mtrr.pool-uncachable",
        "kernel.lockdown",
        "memory.auto-online",
        "dax.permissions",
    ):
        assert required in reg, required
    # grouped by topic in the documented order
    ranks = [TOPIC_ORDER.index(i.split(".")[0]) if i.split(".")[0] in TOPIC_ORDER else len(TOPIC_ORDER) for i in ids]
    assert ranks == sorted(ranks)


def test_registry_refuses_bad_and_duplicate_ids():
    reg = Registry()
    with pytest.raises(ValueError, match="topic.kebab-name"):
        reg.add(Check("NoTopic", "x", Severity.ERROR, lambda c: CheckResult.ok("x")))
    reg.add(Check("a.b", "x", Severity.ERROR, lambda c: CheckResult.ok("x")))
    with pytest.raises(ValueError, match="twice"):
        reg.add(Check("a.b", "y", Severity.ERROR, lambda c: CheckResult.ok("y")))


def test_a_crashing_check_fails_with_its_error_and_the_others_still_run():
    outcomes = {o.id: o for o in run_checks(tiny_registry(), ctx(nocxl()))}
    crashed = outcomes["tools.crashes"]
    assert crashed.status is Status.FAIL and crashed.crashed
    assert "KeyError" in crashed.result.reason and "'missing'" in crashed.result.reason
    assert "--ignore tools.crashes" in crashed.result.fix
    assert outcomes["tools.fine"].status is Status.OK
    assert list(outcomes) == ["tools.fine", "tools.broken", "tools.crashes", "tools.soft"]


def test_a_check_returning_something_else_counts_as_crashed():
    reg = Registry()
    reg.add(Check("a.none", "x", Severity.ERROR, lambda c: None))  # type: ignore[arg-type, return-value]
    (outcome,) = run_checks(reg, ctx(nocxl()))
    assert outcome.crashed and outcome.status is Status.FAIL


def test_warning_severity_caps_a_failure_at_warn():
    outcomes = {o.id: o for o in run_checks(tiny_registry(), ctx(nocxl()))}
    assert outcomes["tools.soft"].status is Status.WARN
    assert outcomes["tools.soft"].result.fix == "soft fix"


def test_ignore_downgrades_a_failure_to_a_warning_and_says_so():
    reg = tiny_registry()
    outcomes = {o.id: o for o in run_checks(reg, ctx(nocxl()), validate_ignores(reg, ["tools.broken"]))}
    broken = outcomes["tools.broken"]
    assert broken.status is Status.WARN and broken.ignored
    assert "ignored" in broken.result.reason
    assert outcomes["tools.crashes"].status is Status.FAIL
    everything = run_checks(reg, ctx(nocxl()), validate_ignores(reg, ["all"]))
    assert all(o.status is not Status.FAIL for o in everything)


def test_ignore_accepts_comma_lists_and_any_case():
    reg = tiny_registry()
    assert validate_ignores(reg, ["tools.broken,TOOLS.FINE", ""]) == {"tools.broken", "tools.fine"}


def test_unknown_ignore_is_a_usage_error_with_did_you_mean():
    with pytest.raises(UsageError) as info:
        validate_ignores(builtin_registry(), ["ddio.disable"])
    err = info.value
    assert err.exit_code == ExitCode.USAGE
    assert "did you mean ddio.disabled" in err.what
    assert "dax.mode-devdax" in err.why  # the list of known ids
    with pytest.raises(UsageError, match="did you mean ddio.disabled"):
        validate_ignores(builtin_registry(), ["ddio"])


def test_report_exit_code_and_json_shape():
    outcomes = tuple(run_checks(builtin_registry(), ctx(beluga_like())))
    report = DoctorReport("beluga-01", None, None, outcomes)
    assert report.exit_code == ExitCode.OK
    data = report.to_dict()
    assert data["summary"]["fail"] == 0
    assert {"id", "status", "reason", "fix", "severity"} <= set(data["checks"][0])
    assert {c["id"]: c["severity"] for c in data["checks"]}["gpu.numa-locality"] == "warning"
    assert len(data["checks"]) == len(builtin_registry().ids)
    failing = DoctorReport("x", None, None, tuple(run_checks(tiny_registry(), ctx(nocxl()))))
    assert failing.exit_code == ExitCode.FAILED
    assert failing.summary() == {"ok": 1, "warn": 1, "fail": 2, "skip": 0}


def test_the_check_catalogue_lists_every_check_and_marks_the_warning_ones():
    import re
    from pathlib import Path

    import belugactl.workflows.doctor as pkg

    text = (Path(pkg.__file__).parent / "CHECKS.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9.-]+)`( \*\(warning\)\*)? \|", text, flags=re.M)
    reg = builtin_registry()
    assert [r[0] for r in rows] == reg.ids
    for check_id, marked in rows:
        assert bool(marked) == (reg.get(check_id).severity is Severity.WARNING), check_id
