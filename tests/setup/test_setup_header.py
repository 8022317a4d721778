"""Pool header: first writer wins the claim, the others verify; mismatches come with a field diff."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from belugactl.errors import StepFailed
from belugactl.host.host import Host
from belugactl.pool import header as hdr
from belugactl.workflows.setup.topics.header import HeaderMismatch, judge, write_or_verify_header
from tests.support.fake_machine import lab_target

MiB = 1 << 20


def pool(tmp_path: Path, name: str = "pool.raw") -> tuple[Host, str]:
    (tmp_path / "dev").mkdir(exist_ok=True)
    path = tmp_path / "dev" / name
    with open(path, "wb") as fh:
        fh.truncate(4 * MiB)
    return Host(tmp_path), f"/dev/{name}"


def test_first_writer_writes_and_reads_back(tmp_path):
    host, dev = pool(tmp_path)
    spec = lab_target().header
    outcome = write_or_verify_header(host, dev, spec, settle_s=0, nonce=0x1234)
    assert outcome.wrote and outcome.claim == 0x1234
    data = host.read_bytes(dev, hdr.HEADER_REGION)
    assert hdr.read_claim(data) == 0x1234
    assert judge(spec, data).state == "match"


@pytest.mark.parametrize("racers", [2, 4])
def test_racing_hosts_one_writes_the_others_verify(tmp_path, racers):
    host, dev = pool(tmp_path)
    specs = [lab_target("lab-1" if i % 2 == 0 else "lab-2").header for i in range(racers)]
    barrier = threading.Barrier(racers)
    outcomes: list[object] = [None] * racers

    def go(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = write_or_verify_header(Host(tmp_path), dev, specs[i], settle_s=0.05, nonce=100 + i)
        except Exception as exc:  # collected and asserted on below
            outcomes[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(not isinstance(o, Exception) for o in outcomes), outcomes
    writers = [o for o in outcomes if o.wrote]
    assert len(writers) == 1
    assert {o.claim for o in outcomes} == {writers[0].claim}
    assert hdr.read_claim(host.read_bytes(dev, 256)) == writers[0].claim


def test_claim_without_header_times_out_with_the_fix(tmp_path):
    host, dev = pool(tmp_path)
    with open(host.path(dev), "r+b") as fh:
        fh.seek(hdr.CLAIM_OFFSET)
        fh.write((0xDEAD).to_bytes(8, "little"))
    spec = lab_target().header
    assert judge(spec, host.read_bytes(dev, hdr.HEADER_REGION)).state == "claimed"
    with pytest.raises(StepFailed) as err:
        write_or_verify_header(host, dev, spec, settle_s=0, wait_s=0.1)
    assert "wrote no header" in err.value.what and "--force" in err.value.fix
    # --force takes the claim over and writes.
    assert write_or_verify_header(host, dev, spec, rewrite=True, settle_s=0, nonce=7).wrote


def test_a_header_from_another_manifest_is_diffed_field_by_field(tmp_path):
    host, dev = pool(tmp_path)
    write_or_verify_header(host, dev, lab_target().header, settle_s=0)
    new_uuid = "uuid: 00000000-0000-4000-8000-000000000001"
    other = lab_target(edit={"uuid: 5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01": new_uuid})
    verdict = judge(other.header, host.read_bytes(dev, hdr.HEADER_REGION))
    assert verdict.state == "differs"
    assert [r[0] for r in verdict.rows] == ["pool_uuid"]
    assert verdict.rows[0][1:] == ("00000000-0000-4000-8000-000000000001", "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01")
    with pytest.raises(HeaderMismatch) as err:
        write_or_verify_header(host, dev, other.header, settle_s=0, wait_s=0.1)
    assert "pool_uuid: manifest 00000000-0000-4000-8000-000000000001, pool 5b0c6e2a" in err.value.why


def test_garbage_at_offset_zero_is_corrupt_not_a_crash(tmp_path):
    host, dev = pool(tmp_path)
    with open(host.path(dev), "r+b") as fh:
        fh.write(b"\xff" * 4096)
    verdict = judge(lab_target().header, host.read_bytes(dev, hdr.HEADER_REGION))
    assert verdict.state == "corrupt" and "magic" in verdict.reason
