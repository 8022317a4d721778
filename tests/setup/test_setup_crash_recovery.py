"""What a setup killed mid-way leaves, and its rerun.

A stale claim of this host is taken over; another host's needs --force; a raw namespace left by an
interrupted `ndctl create-namespace` is finished without --force.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from belugactl.errors import StepFailed
from belugactl.host.host import Host
from belugactl.pool import header as hdr
from belugactl.workflows.setup.applier import SetupFailed, run_setup
from belugactl.workflows.setup.topics import header as header_topic
from belugactl.workflows.setup.topics.header import judge, write_or_verify_header
from tests.support.fake_machine import lab_target
from tests.support.pool_bytes import head

UUID = "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"  # examples/lab.yaml pool.namespace.uuid


def _leave_claim(pool_file, claim: int, *, body: bytes = b"") -> None:
    """What a setup killed after its compare-and-swap leaves: no magic, the claim word, maybe the body."""
    with open(pool_file, "r+b") as fh:
        fh.write(bytes(hdr.MAX_HEADER_SIZE))
        if body:
            fh.seek(0)
            fh.write(body)
        fh.seek(hdr.CLAIM_OFFSET)
        fh.write(claim.to_bytes(8, "little"))


@pytest.fixture
def quick_wait(monkeypatch):
    """Setup waits 30 s for a racing writer; the tests need the same path, only shorter."""
    monkeypatch.setattr(header_topic, "write_or_verify_header", functools.partial(write_or_verify_header, wait_s=0.2))


def _pool(tmp_path: Path) -> tuple[Host, str, Path]:
    (tmp_path / "dev").mkdir()
    path = tmp_path / "dev" / "pool.raw"
    path.write_bytes(bytes(4 << 20))
    return Host(tmp_path), "/dev/pool.raw", path


def test_nonces_carry_the_host_tag():
    hosts = [h.name for h in lab_target().header.ours.hosts]
    assert len(hosts) >= 2
    tags = {hdr.claim_tag(h) for h in hosts}
    assert len(tags) == len(hosts) and 0 not in tags
    n1, n2 = hdr.claim_nonce("lab-1"), hdr.claim_nonce("lab-1")
    assert n1 != n2 and hdr.claimed_by(n1, "lab-1") and not hdr.claimed_by(n1, "lab-2")
    assert hdr.claim_nonce("lab-1", low=0x1234) & 0xFFFFFFFF == 0x1234
    assert not hdr.claimed_by(0, "lab-1") and not hdr.claimed_by(0xDEAD, "lab-1")  # untagged: nobody's


def test_writer_takes_over_its_own_stale_claim(tmp_path):
    host, dev, path = _pool(tmp_path)
    spec = lab_target("lab-1").header
    stale = hdr.claim_nonce("lab-1")
    _leave_claim(path, stale)
    assert judge(spec, head(path, hdr.HEADER_REGION)).state == "claimed"
    out = write_or_verify_header(host, dev, spec, settle_s=0, wait_s=0.1)
    assert out.wrote and out.took_over == stale
    data = head(path, hdr.HEADER_REGION)
    assert judge(spec, data).state == "match"
    assert hdr.read_claim(data) == out.claim != stale and hdr.claimed_by(out.claim, "lab-1")


def test_another_hosts_claim_is_not_taken_without_force(tmp_path):
    host, dev, path = _pool(tmp_path)
    foreign = hdr.claim_nonce("lab-2")
    _leave_claim(path, foreign)
    with pytest.raises(StepFailed) as err:
        write_or_verify_header(host, dev, lab_target("lab-1").header, settle_s=0, wait_s=0.1)
    assert "wrote no header" in err.value.what and "--force" in (err.value.fix or "")
    assert hdr.read_claim(head(path, 256)) == foreign  # untouched


def _converged(lab1, pool_file) -> None:
    run_setup(lab1.host, lab_target())
    assert judge(lab_target().header, head(pool_file, hdr.HEADER_REGION)).state == "match"


@pytest.mark.parametrize("with_body", [False, True], ids=["claim-only", "body-without-magic"])
def test_setup_after_a_crash_in_the_header_step_converges_without_force(lab1, pool_file, quick_wait, with_body):
    _converged(lab1, pool_file)
    body = lab_target().header.ours.pack(include_magic=False) if with_body else b""
    stale = hdr.claim_nonce("lab-1")
    _leave_claim(pool_file, stale, body=body)

    plan = run_setup(lab1.host, lab_target(), dry_run=True).initial
    assert [s.id for s in plan.steps] == ["header.write"] and not plan.destructive
    assert "did not finish" in (plan.steps[0].before or "")

    report = run_setup(lab1.host, lab_target())  # no force
    assert [o.step.id for o in report.applied] == ["header.write"]
    assert f"took over this host's stale claim {stale:#018x}" in report.applied[0].detail
    assert run_setup(lab1.host, lab_target()).applied == []


def test_another_hosts_stale_claim_fails_then_force_takes_it(lab1, pool_file, quick_wait):
    _converged(lab1, pool_file)
    foreign = hdr.claim_nonce("lab-2")
    _leave_claim(pool_file, foreign)

    with pytest.raises(SetupFailed) as err:
        run_setup(lab1.host, lab_target())
    assert "wrote no header" in err.value.what and "--force" in (err.value.fix or "")
    assert hdr.read_claim(head(pool_file, 256)) == foreign

    # --force plans a take-over (not the same wait again) and it converges.
    plan = run_setup(lab1.host, lab_target(), force=True, dry_run=True).initial
    assert [s.id for s in plan.destructive] == ["header.write"]
    assert plan.steps[0].actions[0].rewrite
    report = run_setup(lab1.host, lab_target(), force=True)
    assert [o.step.id for o in report.applied] == ["header.write"]
    data = head(pool_file, hdr.HEADER_REGION)
    assert judge(lab_target().header, data).state == "match" and hdr.claimed_by(hdr.read_claim(data), "lab-1")
    assert run_setup(lab1.host, lab_target()).applied == []


def test_untagged_claims_from_older_versions_are_nobodys(lab1, pool_file, quick_wait):
    _converged(lab1, pool_file)
    _leave_claim(pool_file, 0xDEAD)
    with pytest.raises(SetupFailed):
        run_setup(lab1.host, lab_target())
    assert run_setup(lab1.host, lab_target(), force=True).applied[0].step.id == "header.write"


def _raw_like_an_interrupted_create(lab1) -> None:
    """What the lab showed after a crash inside `ndctl create-namespace -m devdax`: the namespace's
    labels (uuid, name) are back after the reboot, in mode raw, with no devdax info block."""
    ns = lab1.state.namespaces[0]
    ns["mode"] = "raw"
    for key in ("map", "align"):
        ns.pop(key, None)


def test_a_raw_namespace_left_by_an_interrupted_create_is_finished_without_force(lab1, pool_file):
    _converged(lab1, pool_file)
    _raw_like_an_interrupted_create(lab1)
    plan = run_setup(lab1.host, lab_target(), dry_run=True).initial
    assert plan.steps[0].id == "devdax.reconfigure" and not plan.destructive
    # Destroy then create: `create-namespace -e NS -u UUID` is refused by the kernel while NS holds UUID.
    destroy, create = (a.argv for a in plan.steps[0].actions)
    assert destroy == ("ndctl", "destroy-namespace", "-f", "namespace0.0")
    assert create[:2] == ("ndctl", "create-namespace") and "-e" not in create
    assert create[create.index("-u") + 1] == UUID and create[create.index("-r") + 1] == "region0"
    report = run_setup(lab1.host, lab_target())  # no force
    assert report.applied[0].step.id == "devdax.reconfigure"
    assert lab1.state.namespaces[0]["mode"] == "devdax"
    assert run_setup(lab1.host, lab_target()).applied == []


def test_a_raw_namespace_with_another_name_still_needs_force(lab1, pool_file):
    _converged(lab1, pool_file)
    _raw_like_an_interrupted_create(lab1)
    lab1.state.namespaces[0]["name"] = "someone-elses"
    plan = run_setup(lab1.host, lab_target(), dry_run=True).initial
    assert [s.id for s in plan.destructive] == ["devdax.reconfigure"]
