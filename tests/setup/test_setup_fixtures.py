"""The planner on the discovery engineer's fixture trees (recorded tool output, hand-written sysfs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.errors import EnvironmentProblem, InputError
from belugactl.host.host import Host
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.applier import run_setup
from belugactl.workflows.setup.target import target_from_manifest
from tests.support.fake_machine import lab_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tree(name: str) -> Host:
    root = FIXTURES / name
    if not root.is_dir():
        pytest.skip(f"fixture tree {name} not present")
    return Host.from_tree(root)


# beluga-intel's dax device is 512 GiB; the example rack's pool is 8 TiB (which setup refuses, below).
FITS_BELUGA_INTEL = {"size: 8TiB": "size: 512GiB"}


def beluga(host: str = "beluga-00", *, edit: dict[str, str] | None = None):
    text = (EXAMPLES / "beluga-rack.yaml").read_text()
    for old, new in (edit or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    manifest = load_manifest_text(text, file="beluga-rack.yaml")
    return target_from_manifest(manifest, host, layout=resolve_layout(manifest))


def test_a_pool_larger_than_the_device_is_refused_by_plan(capsys):
    from belugactl.cli.app import run
    from belugactl.errors import InputError

    with pytest.raises(InputError) as err:
        run_setup(tree("beluga-intel"), beluga(), dry_run=True)
    assert err.value.what == "pool.size is 8 TiB, but the pool's dax device dax0.0 on this host is 512 GiB"
    assert "set pool.size: 512GiB" in err.value.fix
    for verb in (["plan"], ["setup", "--dry-run"]):
        code = run([*verb, "-f", str(EXAMPLES / "beluga-rack.yaml"), "--host", "beluga-00",
                    "--root", str(FIXTURES / "beluga-intel")])
        assert code == 2
        assert "pool.size is 8 TiB" in capsys.readouterr().err


def test_a_region_pool_larger_than_its_memdevs_is_refused(lab1):
    target = lab_target(edit={"size: 510MiB": "size: 8TiB", "region_size: 512MiB": "region_size: 8TiB"})
    with pytest.raises(InputError) as err:
        run_setup(lab1.host, target, dry_run=True)
    assert err.value.what == "pool.size is 8 TiB, but the pool's memdev(s) on this host hold 512 MiB"
    assert "mem0 512 MiB" in err.value.why and "at most 512 MiB" in err.value.fix


def test_beluga_intel_firmware_pool_online_as_ram_needs_force():
    plan = run_setup(tree("beluga-intel"), beluga(edit=FITS_BELUGA_INTEL), dry_run=True).initial
    first = plan.steps[0]
    assert first.id == "devdax.reconfigure" and first.destroys_data
    assert first.actions[0].argv == ("daxctl", "reconfigure-device", "--mode=devdax", "--force", "dax0.0")
    assert "memory blocks online" in first.before
    assert {s.id for s in plan.steps} >= {"hugepages.node0", "hugepages.node1", "thp.enabled", "mtrr.add"}
    ddio = next(s for s in plan.skipped if s.topic == "ddio")
    assert "Sapphire Rapids" in ddio.reason and "BIOS" in ddio.reason


def test_beluga_intel_mtrr_pieces_cover_the_dax_range():
    plan = run_setup(tree("beluga-intel"), beluga(edit=FITS_BELUGA_INTEL), dry_run=True).initial
    step = next(s for s in plan.steps if s.id == "mtrr.add")
    pieces = [(a.base, a.size) for a in step.actions]
    assert all(base % size == 0 and size & (size - 1) == 0 for base, size in pieces)
    for (b1, s1), (b2, _) in zip(pieces, pieces[1:], strict=False):
        assert b1 + s1 == b2


def test_lab_guest_is_converged_but_for_the_header():
    # The tree is lab-1 after setup: found by its label uuid (ndctl's "uuid" is the info block's).
    plan = run_setup(tree("lab-guest"), lab_target(), dry_run=True).initial
    assert [s.id for s in plan.steps] == ["header.write-or-verify"]  # a tree has no /dev/dax0.0 to read


def _other_namespace(tmp_path: Path) -> Path:
    """A copy of lab-guest whose namespace carries someone else's label uuid."""
    root = _copy("lab-guest", tmp_path)
    (root / "sys/bus/nd/devices/namespace0.0/uuid").write_text("0f0e0d0c-0b0a-4908-8706-050403020100\n")
    return root


def test_lab_guest_namespace_with_another_uuid_is_a_destructive_replace(tmp_path):
    plan = run_setup(Host.from_tree(_other_namespace(tmp_path)), lab_target(), dry_run=True).initial
    step = plan.steps[0]
    assert step.id == "devdax.reconfigure" and step.destroys_data
    assert "0f0e0d0c-0b0a-4908-8706-050403020100" in step.before
    argv = step.actions[0].argv
    assert argv[:5] == ("ndctl", "create-namespace", "-f", "-e", "namespace0.0")
    assert "-u" in argv and argv[argv.index("-u") + 1] == "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"


@pytest.mark.parametrize("name", ["nocxl", "amd-host"])
def test_hosts_without_pool_capacity_are_refused_clearly(name):
    with pytest.raises(EnvironmentProblem) as err:
        run_setup(tree(name), lab_target(), dry_run=True)
    assert "no CXL memory device" in err.value.what and "cxl list -M" in err.value.fix


def _copy(name: str, tmp_path: Path) -> Path:
    import shutil

    src = FIXTURES / name
    if not src.is_dir():
        pytest.skip(f"fixture tree {name} not present")
    dst = tmp_path / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_destructive_plan_without_force_changes_nothing(tmp_path, capsys):
    from belugactl.cli.app import run

    root = _other_namespace(tmp_path)
    lab = str(EXAMPLES / "lab.yaml")
    before = _files(root)
    assert run(["setup", "-f", lab, "--host", "lab-1", "--root", str(root), "--write-root"]) == 1
    err = capsys.readouterr().err
    assert "would destroy data; nothing was changed" in err and "devdax.reconfigure" in err
    # --force from a script without --yes: refused before anything runs.
    assert run(["setup", "-f", lab, "--host", "lab-1", "--root", str(root), "--write-root", "--force"]) == 2
    assert "rerun with --yes" in capsys.readouterr().err
    after = _files(root)
    after.pop("run/belugactl/setup.lock", None)
    assert after == before


def test_pool_permissions_from_the_manifest_reach_the_plan():
    edit = {"  namespace:  ": '  permissions: {owner: root, group: "990", mode: "0640"}\n  namespace:  '}
    target = lab_target(edit=edit)
    assert (target.permissions.owner, target.permissions.group, target.permissions.mode) == ("root", "990", 0o640)
    assert lab_target().permissions.mode == 0o660  # the default when the manifest says nothing
    # lab-guest's node is root:root 0660 (setup's default): the manifest's permissions are a change to make.
    plan = run_setup(tree("lab-guest"), target, dry_run=True).initial
    step = next(s for s in plan.steps if s.id == "permissions.dax")
    assert step.after == "root:990 0640" and "root:root" in step.before


def test_setup_discovers_only_what_its_target_needs():
    from belugactl.workflows.discover import TOPICS
    from belugactl.workflows.setup.observe import discovery_topics

    lab = lab_target()  # ddio unmanaged, pmem region
    assert discovery_topics(lab) == TOPICS - {"pci", "tools"}
    # DDIO bits saved by an earlier setup still need the root ports to be restored.
    assert "pci" in discovery_topics(lab, {"previous": {"ddio": {"0000:35:00.0": {}}}})
    rack = beluga()  # ddio disabled: root ports needed
    assert "pci" in discovery_topics(rack)
    ram = lab_target(edit={"type: pmem ": "type: ram "})
    assert "tools" in discovery_topics(ram)  # ndctl >= 77 is checked for ram regions
    # The plan on the converged lab guest is the same with the narrower discovery.
    plan = run_setup(tree("lab-guest"), lab, dry_run=True).initial
    assert [s.id for s in plan.steps] == ["header.write-or-verify"]
