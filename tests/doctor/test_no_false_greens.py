"""Doctor never reports green for what it did not check, and its advice names real paths and safe ignores.

Issue 34, items 6 and 7: a host without CXL is "nothing to check" (exit 3, or 0 with --allow-no-cxl),
a folder that is not a host tree is refused, an old ndctl warns when nothing says the pool is pmem,
fixes name the manifest given with -f, and the summary never offers `--ignore` for a check guarding data.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from belugactl.cli.app import run
from belugactl.workflows.doctor import Status, builtin_registry
from belugactl.workflows.doctor.registry import REGISTRY
from tests.support.doctor_snapshots import beluga_like, ctx, expectations

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
LAB_RAM = REPO / "examples" / "lab-ram.yaml"

# The checks whose failure means the pool's data is lost or about to be: never offered to --ignore.
DATA_GUARDS = {
    "dax.mode-devdax", "dax.map-mem", "dax.size-matches-manifest", "pool.header", "cxl.media-errors",
    "memory.auto-online",  # an online policy hands the pool's memory to the kernel as RAM
}  # fmt: skip


def test_no_cxl_host_exits_3_by_default_and_says_nothing_was_checked(capsys):
    assert run(["doctor", "--root", str(FIXTURES / "nocxl")]) == 3
    out = capsys.readouterr().out
    last = _closing_line(out)
    assert "no CXL memory devices found: nothing to check" in last and "--allow-no-cxl" in last
    assert "✓" not in last


def test_allow_no_cxl_keeps_exit_0_for_ci_images(capsys):
    assert run(["doctor", "--root", str(FIXTURES / "nocxl"), "--allow-no-cxl"]) == 0
    capsys.readouterr()
    assert run(["doctor", "--json", "--root", str(FIXTURES / "nocxl")]) == 3
    assert json.loads(capsys.readouterr().out)["has_cxl"] is False


def test_a_cxl_host_keeps_its_exit_codes():
    assert run(["doctor", "--root", str(FIXTURES / "amd-host")]) == 0
    assert run(["doctor", "--root", str(FIXTURES / "beluga-intel")]) == 1


def test_root_that_is_not_a_host_tree_is_refused_with_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a machine\n")
    assert run(["doctor", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a host tree" in err and "sys/" in err and "Traceback" not in err


def test_old_ndctl_on_a_cxl_host_without_a_pool_warns_not_ok():
    # CXL memdevs, no region yet, no manifest: the pool to build is a ram region, which ndctl 76 cannot make.
    bare = replace(beluga_like(), cxl=replace(beluga_like().cxl, regions=[]))
    result = REGISTRY.get("tools.ndctl-version").run(ctx(bare))
    assert result.status is Status.WARN
    assert "cannot create ram regions" in result.reason and ">= 77" in result.fix
    # A manifest asking for a pmem region is served by ndctl 76: ok, and it says why.
    pmem = REGISTRY.get("tools.ndctl-version").run(ctx(bare, expectations()))
    assert pmem.status is Status.OK and "manifest" in pmem.reason


def test_fixes_name_the_manifest_given_with_f(capsys, tmp_path):
    # A long path (CI's checkout is deeper than a developer's) makes the fix wrap at 80 columns with
    # shell continuations: pasted back as one command it still names the manifest given with -f.
    deep = tmp_path / "a-checkout-path-long-enough-to-wrap" / "examples"
    deep.mkdir(parents=True)
    manifest = deep / "lab-ram.yaml"
    manifest.write_text(LAB_RAM.read_text())
    code = run(["doctor", "-f", str(manifest), "--host", "lab-1", "--root", str(FIXTURES / "ram-fresh")])
    assert code == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines() if str(manifest) not in line) <= 80
    as_pasted = re.sub(r" \\\n\s*", " ", out)
    assert f"belugactl setup -f {manifest} --host lab-1" in as_pasted
    assert "-f MANIFEST" not in out


def test_the_registry_marks_the_checks_that_guard_data():
    marked = {c.id for c in builtin_registry() if c.guards_data}
    assert marked == DATA_GUARDS


def _closing_line(out: str) -> str:
    """The last line, with its continuation lines joined (doctor wraps it at 80 columns)."""
    lines = out.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if not line.startswith(" "))
    return " ".join(" ".join(lines[start:]).split())


def test_summary_never_suggests_ignoring_a_check_that_guards_data(capsys):
    root = str(FIXTURES / "beluga-intel")
    assert run(["doctor", "--root", root]) == 1
    last = _closing_line(capsys.readouterr().out)
    assert "--ignore ddio.disabled" in last  # not dax.mode-devdax nor memory.auto-online: both guard data
    for guard in DATA_GUARDS:
        assert f"--ignore {guard}" not in last
    # Only data guards left failing: no --ignore hint at all.
    assert run(["doctor", "--root", root, "--ignore", "ddio.disabled"]) == 1
    last = _closing_line(capsys.readouterr().out)
    assert "guard the pool's data" in last and "--ignore " not in last.replace("do not --ignore", "")
