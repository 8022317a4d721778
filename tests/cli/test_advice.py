"""Advice that is right, and no green where nothing was set up (issue 34, items 6 and 7).

The version rule names only what is too old; a missing pool names `pool create-file`; a bad
`--bind` is an invalid address, not a busy port; `plan` and `setup --dry-run` preview a fixture
tree or a captured bundle with `--root`, and a real setup on one is refused; a bare host has
nothing to tear down rather than "matching the manifest"; `pool inspect` fails on a header that
differs from the manifest.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
EXAMPLES = REPO / "examples"
LAB = str(EXAMPLES / "lab.yaml")
SINGLE = str(EXAMPLES / "single-host.yaml")  # a ram region pool: needs ndctl >= 77 and kernel >= 6.3
CPU_DEMO = str(EXAMPLES / "cpu-demo.yaml")


def _tree(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst, symlinks=True)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


# --- the ram-region version rule -----------------------------------------------------------------


def test_new_kernel_with_old_ndctl_is_told_to_upgrade_ndctl_only(cli, tmp_path):
    root = _tree(tmp_path, "nocxl")  # ndctl 76.1
    (root / "proc/sys/kernel/osrelease").write_text("6.18.0-1-amd64\n")
    result = cli("plan", "-f", SINGLE, "--host", "gpu-0", "--root", str(root))
    assert result.code == 3, result.stderr
    assert "upgrade ndctl (to ndctl >= 77)" in result.stderr
    assert "kernel (to" not in result.stderr and "the kernel" not in result.stderr.split("fix:")[-1]


def test_old_kernel_and_old_ndctl_are_both_named(cli, tmp_path):
    root = _tree(tmp_path, "nocxl")  # kernel 6.1, ndctl 76.1
    result = cli("plan", "-f", SINGLE, "--host", "gpu-0", "--root", str(root))
    assert result.code == 3
    assert "upgrade ndctl and the kernel (to ndctl >= 77 and kernel >= 6.3)" in result.stderr


# --- a missing pool, a bad address ----------------------------------------------------------------


def test_missing_pool_names_pool_create_file(cli, tmp_path):
    missing = tmp_path / "nowhere.pool"
    result = cli("pool", "inspect", str(missing), "-f", CPU_DEMO)
    assert result.code == 3
    assert f"belugactl pool create-file -f {CPU_DEMO} {missing}" in result.stderr  # the file given, not a placeholder


@pytest.mark.parametrize(
    "argv",
    [
        ["metadata-server", "-f", CPU_DEMO, "--bind", "999.1.1.1"],
        ["metadata-server", "-f", CPU_DEMO, "--rpc-bind", "999.1.1.1"],
        ["pd-proxy", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--bind", "999.1.1.1"],
    ],
    ids=["metadata-server", "metadata-server-rpc", "pd-proxy"],
)
def test_an_invalid_bind_address_is_a_usage_error_not_a_busy_port(cli, argv):
    result = cli(*argv)
    assert result.code == 2, result.stderr
    assert "999.1.1.1: not a valid IP address or host name" in result.stderr
    assert "port" not in result.stderr.split("fix:")[0].lower()


# --- --root on plan and setup ---------------------------------------------------------------------


def test_plan_and_setup_show_root_in_help(cli):
    for command in ("plan", "setup"):
        assert "--root" in cli(command, "--help").stdout, command


def test_plan_previews_a_captured_bundle(cli, tmp_path):
    bundle = tmp_path / "lab-guest.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(FIXTURES / "lab-guest", arcname=".")
    result = cli("plan", "-f", LAB, "--host", "lab-1", "--root", str(bundle))
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("lab-1: setup:")


def test_real_setup_or_teardown_on_a_root_is_refused_and_changes_nothing(cli, tmp_path):
    root = _tree(tmp_path, "lab-guest")
    before = _files(root)
    for verb in ("setup", "teardown"):
        result = cli(verb, "-f", LAB, "--host", "lab-1", "--root", str(root))
        assert result.code == 2, (verb, result.stderr)
        assert "would change the files of that tree" in result.stderr and "--dry-run" in result.stderr
    assert cli("setup", "-f", LAB, "--host", "lab-1", "--root", str(root), "--dry-run").code == 0
    assert _files(root) == before


def test_plan_root_that_is_not_a_host_tree_is_refused(cli, tmp_path):
    result = cli("plan", "-f", LAB, "--host", "lab-1", "--root", str(tmp_path))
    assert result.code == 2
    assert "not a host tree" in result.stderr


# --- nothing set up is not "matches the manifest" --------------------------------------------------


@pytest.mark.parametrize("argv", [["teardown", "--dry-run"], ["plan", "--teardown"]], ids=["teardown", "plan"])
def test_teardown_on_a_bare_host_says_there_is_nothing_to_tear_down(cli, tmp_path, argv):
    root = _tree(tmp_path, "nocxl")
    result = cli(*argv, "-f", LAB, "--host", "lab-1", "--root", str(root))
    assert result.code == 0, result.stderr
    assert "nothing to tear down" in result.stdout
    assert "matches the manifest" not in result.stdout


# --- pool inspect against another manifest -----------------------------------------------------------


def test_pool_inspect_exits_1_when_the_header_differs_from_the_manifest(cli, tmp_path):
    pool = tmp_path / "demo.pool"
    assert cli("pool", "create-file", "-f", CPU_DEMO, str(pool)).code == 0
    assert cli("pool", "inspect", str(pool), "-f", CPU_DEMO).code == 0
    other = cli("pool", "inspect", str(pool), "-f", LAB)
    assert other.code == 1
    assert "DIFFERS" in other.stdout
    assert cli("pool", "inspect", str(pool), "-f", LAB, "--json").code == 1
