"""One function from a device name to a path, one rule for which device is the pool (issue 10 part 1).

Before, `serve` fell back to /dev/dax0.0 when a region pool's device was unknown; mapping a guessed
device risks writing over someone else's data. Now every command that needs the pool says how to
name it, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.errors import ExitCode
from belugactl.model.manifest import load_manifest
from belugactl.pool.device import PoolDeviceUndecided, device_name, device_path, is_device, pool_device
from tests.support.paths import CPU_DEMO, LAB


def test_device_names_and_paths():
    assert device_path("dax0.0") == "/dev/dax0.0"
    assert device_path("/dev/dax1.0") == "/dev/dax1.0"
    assert device_path("/srv/pool.raw") == "/srv/pool.raw"
    assert device_name("/dev/dax0.0") == device_name("dax0.0") == "dax0.0"
    assert is_device("/dev/dax0.0") and not is_device("/tmp/pool.raw")
    with pytest.raises(ValueError):
        device_path("")


def test_the_rule(tmp_path, monkeypatch):
    lab, demo = load_manifest(LAB), load_manifest(CPU_DEMO)
    monkeypatch.chdir(tmp_path)
    assert pool_device(lab, explicit="/dev/dax3.0") == "/dev/dax3.0"
    assert pool_device(lab, explicit="pool.raw") == str(tmp_path / "pool.raw")  # a file pool, made absolute
    assert pool_device(demo) == "/dev/dax0.0"  # the manifest names the device (stored without /dev/)
    assert pool_device(lab, discover=lambda: "dax1.0") == "/dev/dax1.0"  # the region pool's device, found
    with pytest.raises(PoolDeviceUndecided) as info:
        pool_device(lab, discover=lambda: None, host_name="lab-1")
    err = info.value
    assert err.exit_code == ExitCode.USAGE and "lab-1" in err.what
    assert "--pool" in err.fix and "name it in the manifest" in err.fix


@pytest.fixture
def no_dax_here(monkeypatch):
    """This machine has no dax device for the lab's namespace (whatever machine runs the tests)."""
    import belugactl.workflows.setup.observe as target

    asked = []
    monkeypatch.setattr(target, "find_pool_device", lambda host, manifest, name: asked.append(name))
    return asked


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "-f", str(LAB), "--host", "lab-1", "--dry-run"],
        ["metadata-server", "-f", str(LAB), "--host", "lab-1"],
        ["rack", "agent", "probe-read", "-f", str(LAB), "--host", "lab-1", "--nonce", "7"],
    ],
    ids=["serve", "metadata-server", "rack-probe"],
)
def test_an_undecidable_pool_is_exit_2_never_a_guess(argv, cli, no_dax_here):
    result = cli(*argv)
    assert result.code == ExitCode.USAGE, result.stderr
    assert "cannot decide which device is the pool" in result.stderr
    assert "--pool" in result.stderr
    assert "/dev/dax0.0" not in result.stdout
    assert no_dax_here == ["lab-1"]  # asked setup's finder, for this host


def test_serve_uses_the_discovered_device(cli, monkeypatch, tmp_path):
    import belugactl.workflows.setup.observe as target

    monkeypatch.setattr(target, "find_pool_device", lambda host, manifest, name: "dax4.0")
    result = cli("serve", "-f", str(LAB), "--host", "lab-1", "--dry-run", "--json", "--run-dir", str(tmp_path))
    assert result.code == 0, result.stderr
    assert '"pool_path": "/dev/dax4.0"' in result.stdout


def test_serve_takes_the_manifests_device_and_pool_flag(cli, tmp_path: Path):
    result = cli("serve", "-f", str(CPU_DEMO), "--dry-run", "--json", "--run-dir", str(tmp_path))
    assert result.code == 0 and '"pool_path": "/dev/dax0.0"' in result.stdout  # named in cpu-demo.yaml
    result = cli("serve", "-f", str(CPU_DEMO), "--pool", str(tmp_path / "p.pool"), "--dry-run", "--json",
                 "--run-dir", str(tmp_path))
    assert result.code == 0 and f'"pool_path": "{tmp_path / "p.pool"}"' in result.stdout


def test_a_region_pools_device_is_found_by_setups_own_finder():
    """Through the real finder (no stand-in): the lab guest's namespace is dax0.0; a host without CXL has none."""
    from belugactl.host.host import Host
    from belugactl.workflows.rack_context import RackContext
    from tests.support.paths import REPO

    fixtures = REPO / "tests" / "fixtures"
    rack = RackContext(load_manifest(LAB), str(LAB), wanted_host="lab-1")
    assert rack.pool_path(Host.from_tree(fixtures / "lab-guest")) == "/dev/dax0.0"
    with pytest.raises(PoolDeviceUndecided):
        RackContext(load_manifest(LAB), str(LAB), wanted_host="lab-1").pool_path(Host.from_tree(fixtures / "nocxl"))
