"""Doctor with a real manifest: host entry selection, expectations, and the pool header on media."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from belugactl.errors import ExitCode, UsageError
from belugactl.host.host import Host
from belugactl.model.manifest import load_manifest
from belugactl.pool.header import PoolHeader, write_claim
from belugactl.units import MiB
from belugactl.workflows.doctor import DoctorContext, Status, builtin_registry, run_doctor
from belugactl.workflows.doctor.expectations import from_manifest, pick_host
from belugactl.workflows.rack_context import load_rack_context
from tests.support.doctor_snapshots import UUID, beluga_like

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"
RACK = REPO / "examples" / "beluga-rack.yaml"
REGISTRY = builtin_registry()


def test_expectations_come_from_the_manifest_and_the_host_entry():
    manifest = load_manifest(LAB)
    exp = from_manifest(manifest, manifest.host("lab-2"))
    assert exp.host_name == "lab-2" and exp.entry is manifest.host("lab-2")
    assert exp.pool_size == 510 * MiB and exp.region_size == 512 * MiB and exp.align == 2 * MiB
    assert exp.source == "region" and exp.region_type == "pmem"
    assert exp.namespace_uuid == manifest.pool.namespace.uuid
    assert (exp.dev_owner, exp.dev_group, exp.dev_mode) == ("root", "root", 0o660)  # pool.permissions defaults
    assert exp.hosts_sharing == len(manifest.hosts) == 2
    assert exp.ddio == "unmanaged" and exp.pool_memory == "write-back"
    assert [(w.node, w.count) for w in exp.hugepages] == [(0, 64)]
    assert exp.layout is not None and exp.layout.partition_for("lab-2").size > 0


def test_pick_host_by_flag_by_hostname_and_short_name():
    manifest = load_manifest(LAB)
    assert pick_host(manifest, "lab-2", "whatever").name == "lab-2"
    assert pick_host(manifest, None, "lab-1").name == "lab-1"
    assert pick_host(manifest, None, "lab-1.example.org").name == "lab-1"
    with pytest.raises(UsageError, match="did you mean --host lab-1"):
        pick_host(manifest, "lab-11", None)
    with pytest.raises(UsageError, match="not one of the hosts") as info:
        pick_host(manifest, None, "elsewhere")
    assert info.value.exit_code == ExitCode.USAGE
    assert "lab-1, lab-2" in info.value.why


def test_run_doctor_with_a_manifest_checks_against_the_entry():
    snap = replace(beluga_like(), hostname="lab-1")
    report = run_doctor(Host("/nonexistent"), rack=load_rack_context(LAB), snapshot=snap)
    assert report.host_entry == "lab-1"
    by_id = {o.id: o for o in report.outcomes}
    # the lab pins its own namespace uuid; this snapshot's namespace carries another one
    assert by_id["dax.namespace-uuid"].status is Status.FAIL
    assert UUID in by_id["dax.namespace-uuid"].result.reason
    assert by_id["ddio.disabled"].status is Status.SKIP  # lab: ddio unmanaged
    assert report.exit_code == ExitCode.FAILED


def test_host_flag_needs_a_manifest(capsys):
    from belugactl.cli.app import run

    assert run(["doctor", "--host", "lab-1"]) == ExitCode.USAGE
    assert "--host needs a manifest" in capsys.readouterr().err


# --- the pool header, read from a pool file standing in for /dev/dax0.0 ------------------------


def _pool_tree(tmp_path: Path, data: bytes) -> Host:
    (tmp_path / "dev").mkdir(parents=True)
    pool = tmp_path / "dev" / "dax0.0"
    pool.write_bytes(data.ljust(2 * MiB, b"\0"))
    return Host(tmp_path)


def _header_ctx(host: Host, manifest_path: Path = LAB, name: str = "lab-1", **snap_changes) -> DoctorContext:
    manifest = load_manifest(manifest_path)
    exp = from_manifest(manifest, manifest.host(name))
    snap = beluga_like()
    snap = replace(snap, dax=[replace(snap.dax[0], size=exp.pool_size, **snap_changes)])
    return DoctorContext(snap, exp, host)


def _lab_header() -> bytes:
    manifest = load_manifest(LAB)
    exp = from_manifest(manifest, manifest.host("lab-1"))
    return PoolHeader.from_layout(manifest, exp.layout, created_by="lab-1", created_time=1).pack()


def test_pool_header_matching_the_manifest_is_ok(tmp_path):
    result = REGISTRY.get("pool.header").run(_header_ctx(_pool_tree(tmp_path, _lab_header())))
    assert result.status is Status.OK, result
    assert "matches the manifest" in result.reason and "written by lab-1" in result.reason


def test_pool_header_from_another_manifest_fails_with_the_differences(tmp_path):
    host = _pool_tree(tmp_path, _lab_header())
    result = REGISTRY.get("pool.header").run(_header_ctx(host, RACK, load_manifest(RACK).hosts[0].name))
    assert result.status is Status.FAIL
    assert "disagrees" in result.reason
    fields = {d["field"] for d in result.details["differences"]}
    assert "layout_hash" in fields and "pool_uuid" in fields


def test_a_pool_laid_out_by_the_per_instance_layout_is_told_apart(tmp_path):
    from belugactl.model.layout import legacy_layout

    manifest = load_manifest(LAB)
    old = PoolHeader.from_layout(manifest, legacy_layout(manifest), created_by="lab-1", created_time=1).pack()
    result = REGISTRY.get("pool.header").run(_header_ctx(_pool_tree(tmp_path, old)))
    assert result.status is Status.FAIL
    assert result.reason.startswith(
        "the pool header disagrees with this manifest: the pool layout changed: this pool's header was written by "
        "an older belugactl"
    )
    assert "every vLLM process its own ring" in result.reason
    assert "setup -f MANIFEST --force" in result.fix and "DESTROYS every cached KV block" in result.fix
    assert "use the rack's manifest" not in result.fix  # the manifest is right: the layout moved
    assert "rpc_ring_count" in {d["field"] for d in result.details["differences"]}


def test_blank_pool_fails_with_manifest_and_skips_without(tmp_path):
    host = _pool_tree(tmp_path, b"")
    with_manifest = REGISTRY.get("pool.header").run(_header_ctx(host))
    assert with_manifest.status is Status.FAIL and "never initialized" in with_manifest.reason
    assert "belugactl setup" in with_manifest.fix
    without = REGISTRY.get("pool.header").run(DoctorContext(beluga_like(), None, host))
    assert without.status is Status.SKIP and "no manifest names the pool's dax device" in without.reason


def test_corrupted_or_claimed_header_fails_without_a_traceback(tmp_path):
    data = bytearray(_lab_header())
    data[30] ^= 0xFF  # inside the pool uuid: the crc no longer matches
    result = REGISTRY.get("pool.header").run(_header_ctx(_pool_tree(tmp_path / "a", bytes(data))))
    assert result.status is Status.FAIL and "crc" in result.reason
    claimed = bytearray(4096)
    write_claim(claimed, 0xABCDEF)
    result = REGISTRY.get("pool.header").run(_header_ctx(_pool_tree(tmp_path / "b", bytes(claimed))))
    assert result.status is Status.FAIL and "claim" in result.reason


def test_pool_header_skips_when_the_device_cannot_be_mapped(tmp_path):
    result = REGISTRY.get("pool.header").run(_header_ctx(Host(tmp_path)))
    assert result.status is Status.SKIP and "cannot map" in result.reason


def test_data_past_the_first_words_is_not_a_blank_pool_for_doctor_nor_setup(tmp_path):
    # First 16 bytes (magic, version, length) zero, claim word zero, someone's bytes 64 KiB in: the old
    # doctor check read 4 KiB and the first words and called this blank; setup refused it. One rule now.
    from belugactl.pool import header as hdr
    from belugactl.workflows.setup.topics.header import judge
    from tests.support.fake_machine import lab_target

    area = bytearray(hdr.HEADER_REGION)
    area[64 << 10 : (64 << 10) + 4] = b"data"
    assert not any(area[:16]) and hdr.read_claim(area) == 0
    assert not hdr.is_blank(area) and "offset 0x10000: 64 61 74 61" in hdr.occupied_reason(area)
    assert judge(lab_target().header, bytes(area)).state == "occupied"
    host = _pool_tree(tmp_path, bytes(area))
    result = REGISTRY.get("pool.header").run(_header_ctx(host))
    assert result.status is Status.FAIL, result
    assert "not a blank pool" in result.reason and "offset 0x10000" in result.reason
    assert "--force" in result.fix
    # The all-zero area, for contrast, is the never-initialized pool.
    blank = REGISTRY.get("pool.header").run(_header_ctx(_pool_tree(tmp_path / "blank", bytes(hdr.HEADER_REGION))))
    assert blank.status is Status.FAIL and "never initialized" in blank.reason


def test_interleave_ways_left_at_one_means_every_selected_memdev_as_setup_reads_it(tmp_path):
    # Setup builds a region across every selected memdev when ways is 1 (the default); doctor must
    # not then call that region wrong. A count above 1 is held to.
    text = LAB.read_text()
    one = load_manifest(LAB)
    assert from_manifest(one, one.host("lab-1")).interleave_ways is None
    two_path = tmp_path / "two.yaml"
    two_path.write_text(text.replace("ways: 1", "ways: 2").replace("size: 510MiB", "size: 508MiB"))
    two = load_manifest(two_path)
    assert from_manifest(two, two.host("lab-1")).interleave_ways == 2
    snap = beluga_like()
    two_way = replace(snap, cxl=replace(snap.cxl, regions=[replace(snap.cxl.regions[0], interleave_ways=2)]))
    exp = replace(from_manifest(one, one.host("lab-1")), region_type=snap.cxl.regions[0].type)
    geometry = REGISTRY.get("cxl.region-geometry").run(DoctorContext(two_way, exp, Host(tmp_path)))
    assert "interleave" not in geometry.reason, geometry
