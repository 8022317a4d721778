"""A pool device is blank only when its whole header area is zero; setup never writes a header over data
without --force, and says what it would destroy (issue 11, item 6)."""

from __future__ import annotations

import pytest

from belugactl.pool import header as hdr
from belugactl.workflows.setup.applier import SetupFailed, run_setup
from belugactl.workflows.setup.force import ForceRequired
from belugactl.workflows.setup.topics.header import judge
from tests.support.fake_machine import lab_target
from tests.support.pool_bytes import fingerprint, head

AREA = hdr.HEADER_REGION


def _area_with(offset: int, data: bytes) -> bytes:
    area = bytearray(AREA)
    area[offset : offset + len(data)] = data
    return bytes(area)


@pytest.mark.parametrize("offset", [hdr.MAGIC_OFFSET + len(hdr.MAGIC), 16, 4096, AREA - 1])
def test_any_nonzero_byte_in_the_header_area_is_not_blank(offset):
    verdict = judge(lab_target().header, _area_with(offset, b"\x5a"))
    assert verdict.state == "occupied"
    assert f"offset {offset:#x}: 5a" in verdict.reason and "1 of the first 2 MiB" in verdict.reason


def test_an_all_zero_area_is_blank():
    assert judge(lab_target().header, bytes(AREA)).state == "blank"


def _put(pool_file, offset: int, data: bytes) -> None:
    with open(pool_file, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def test_setup_refuses_to_write_a_header_over_data_and_force_writes_it(lab1, pool_file):
    # Someone's bytes 64 KiB into the device: the old check (magic and claim word zero) called it blank.
    junk = b"not a belugactl pool, somebody's data" * 4
    _put(pool_file, 64 << 10, junk)
    before = fingerprint(pool_file)
    with pytest.raises(SetupFailed) as err:
        run_setup(lab1.host, lab_target())
    assert isinstance(err.value.cause, ForceRequired)
    assert "holds data but no pool header; writing the header would destroy it" in err.value.what
    assert "offset 0x10000: 6e 6f 74" in err.value.why and "--force" in err.value.fix
    assert [o.step.id for o in err.value.report.applied] == ["region.create", "devdax.create"]
    assert fingerprint(pool_file) == before  # the header area is untouched

    # Now the device exists: plan refuses up front, plan --force shows the destroying step.
    with pytest.raises(ForceRequired) as refused:
        run_setup(lab1.host, lab_target(), dry_run=True)
    assert "nothing was changed" in refused.value.what
    forced = run_setup(lab1.host, lab_target(), force=True, dry_run=True).initial
    assert [s.id for s in forced.destructive] == ["header.write"]
    assert "offset 0x10000" in forced.destructive[0].before

    report = run_setup(lab1.host, lab_target(), force=True)
    assert "header.write" in [o.step.id for o in report.applied]
    assert judge(lab_target().header, head(pool_file, AREA)).state == "match"
    assert run_setup(lab1.host, lab_target()).applied == []


def test_a_blank_device_still_needs_no_force(lab1, pool_file):
    report = run_setup(lab1.host, lab_target())
    assert "header.write" in [o.step.id for o in report.applied]
    assert not report.initial.destructive
