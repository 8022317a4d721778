"""Setup's ram path on host trees recorded in the ram lab (kernel 6.12, cxl 81, 2 devices behind a switch).

ram-fresh (tests/fixtures, recorded on lab-3 after destroying its region and restoring the kernel's
default policy): memdevs up, no region, auto_online_blocks = online, and memdev names against serial
order (mem0 is serial 0x11). ram-driverless (tests/fixtures, a fresh guest right after
`cxl create-region -t ram` by serial, kmem not loaded): daxctl lists dax0.0 as mode devdax, state
disabled, and /dev/dax0.0 exists but cannot be opened (ENXIO). ram-autoonline (tests/lab/fixtures):
the trap sprung, dax0.0 System RAM.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from belugactl.host.host import Host
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from belugactl.model.setup_plan import RunCommand, WriteAttr, WriteFile
from belugactl.workflows.setup.applier import run_setup
from belugactl.workflows.setup.target import target_from_manifest
from belugactl.workflows.setup.topics import autoonline

REPO = Path(__file__).resolve().parents[2]
FRESH = REPO / "tests" / "fixtures" / "ram-fresh"
DRIVERLESS = REPO / "tests" / "fixtures" / "ram-driverless"
TRAPPED = REPO / "tests" / "lab" / "fixtures" / "ram-autoonline"
MANIFEST = REPO / "examples" / "lab-ram-rack.yaml"


def _plan(root: Path, manifest: Path = MANIFEST, host: str = "lab-3"):
    loaded = load_manifest(str(manifest))
    target = target_from_manifest(loaded, host, layout=resolve_layout(loaded))
    return run_setup(Host.from_tree(root), target, dry_run=True).initial


def _argv(step) -> list[str]:
    return [" ".join(a.argv) for a in step.actions if isinstance(a, RunCommand)]


def _with_kmem_module(tmp_path: Path) -> Path:
    """The recorded tree plus the one file discovery does not capture: the kernel's modules.dep."""
    root = tmp_path / "host"
    shutil.copytree(FRESH, root, symlinks=True)
    release = (FRESH / "proc/sys/kernel/osrelease").read_text().strip()
    dep = root / "lib" / "modules" / release / "modules.dep"
    dep.parent.mkdir(parents=True)
    dep.write_text("kernel/drivers/dax/device_dax.ko.xz:\nkernel/drivers/dax/kmem.ko.xz:\n")
    return root


def test_fresh_host_sets_the_offline_policy_and_blacklists_kmem_before_the_region(tmp_path):
    plan = _plan(_with_kmem_module(tmp_path))
    ids = [s.id for s in plan.steps]
    assert ids.index("autoonline.policy") < ids.index("region.create")
    assert ids.index("autoonline.kmem-blacklist") < ids.index("region.create")
    policy = next(s for s in plan.steps if s.id == "autoonline.policy")
    assert policy.actions == (WriteAttr(autoonline.AUTO_ONLINE, "offline"),)
    assert "ZONE_NORMAL" in (policy.before or "")
    blacklist = next(s for s in plan.steps if s.id == "autoonline.kmem-blacklist")
    (write,) = blacklist.actions
    assert isinstance(write, WriteFile) and write.path == "/etc/modprobe.d/belugactl-kmem.conf"
    assert "blacklist kmem\n" in write.text


def test_no_blacklist_when_the_command_line_keeps_memory_offline(tmp_path):
    root = _with_kmem_module(tmp_path)
    cmdline = root / "proc" / "cmdline"
    cmdline.write_text(cmdline.read_text().strip() + " memhp_default_state=offline\n")
    ids = [s.id for s in _plan(root).steps]
    assert "autoonline.kmem-blacklist" not in ids
    assert "autoonline.policy" in ids  # the live policy still reads online in this tree


def test_region_targets_go_by_serial_not_by_memdev_name(tmp_path):
    # In this boot mem0 is serial 0x11 and mem1 serial 0x10: position 0 must be mem1.
    (create,) = [s for s in _plan(FRESH).steps if s.id == "region.create"]
    assert _argv(create) == ["cxl create-region -m -d decoder0.0 -w 2 -t ram -g 4096 mem1 mem0"]
    # memdevs: all orders by serial too.
    text = MANIFEST.read_text()
    start = text.index("    memdevs:")
    end = text.index("count: 2", start) + len("count: 2")
    text = text[:start] + "    memdevs: all" + text[end:]
    assert "memdevs: all" in text
    manifest = tmp_path / "all.yaml"
    manifest.write_text(text)
    (create,) = [s for s in _plan(FRESH, manifest).steps if s.id == "region.create"]
    assert _argv(create)[0].endswith(" mem1 mem0")


def test_a_pool_onlined_as_system_ram_is_taken_back_after_the_policy_is_fixed():
    plan = _plan(TRAPPED, host="lab-1")
    ids = [s.id for s in plan.steps]
    assert ids[:2] == ["autoonline.policy", "autoonline.kmem-blacklist"]  # kmem is loaded in that tree
    (back,) = [s for s in plan.steps if s.id == "devdax.reconfigure"]
    assert _argv(back) == ["daxctl reconfigure-device --mode=devdax --force dax0.0"]
    assert back.destroys_data


def test_the_policy_topic_leaves_pmem_pools_alone():
    from tests.support.fake_machine import lab_target

    target = lab_target()
    assert target.pool.region_type == "pmem"
    planned = autoonline.plan(target, None)  # type: ignore[arg-type]
    assert not planned.steps and not planned.skipped


def test_a_driverless_ram_region_dax_device_is_bound_before_the_header_is_touched():
    plan = _plan(DRIVERLESS, host="lab-1")
    ids = [s.id for s in plan.steps]
    assert "region.create" not in ids  # the region on 0x10, 0x11 is there
    (bind,) = [s for s in plan.steps if s.id == "devdax.reconfigure"]
    assert _argv(bind) == ["daxctl reconfigure-device --mode=devdax dax0.0"]  # no --force: nothing online
    assert not bind.destroys_data
    (header,) = [s for s in plan.steps if s.topic == "header"]
    assert header.deferred and ids.index("devdax.reconfigure") < ids.index(header.id)
