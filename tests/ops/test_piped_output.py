"""Output read by a newcomer: piped tables are never cut (`0x1000000…`), and doctor on a host without
CXL says so instead of a bare "No issues found"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def _cli(*args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(  # noqa: S603 - our own CLI; stdout is a pipe, as in `| less` or a CI log
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


@pytest.mark.parametrize(
    "args",
    [
        ("discover", "--root", str(FIXTURES / "beluga-intel")),
        ("discover", "--root", str(FIXTURES / "amd-host")),
        ("pool", "show", "-f", "examples/beluga-rack.yaml"),
        ("pool", "show", "-f", "examples/lab.yaml"),
        ("manifest", "check", "-f", "examples/beluga-rack.yaml"),
    ],
    ids=lambda a: " ".join(a[:2]) + " " + Path(a[-1]).name,
)
def test_piped_tables_keep_every_cell_whole(args: tuple[str, ...]) -> None:
    out = _cli(*args)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout, out.stdout
    narrow = _cli(*args, columns="60")  # a narrow terminal's width: cells fold onto more lines, never cut
    assert "…" not in narrow.stdout, narrow.stdout


def test_piped_discover_prints_whole_addresses() -> None:
    doc = json.loads(_cli("discover", "--json", "--root", str(FIXTURES / "beluga-intel")).stdout)
    text = _cli("discover", "--root", str(FIXTURES / "beluga-intel")).stdout
    resources = [d["resource"] for d in doc["dax"] if d.get("resource") is not None]
    assert resources, "the fixture has dax devices with a resource address"
    for resource in resources:
        assert f"{resource:#x}" in text.split()


def test_pool_show_piped_includes_the_detail_column() -> None:
    out = _cli("pool", "show", "-f", "examples/beluga-rack.yaml").stdout
    assert "detail" in out and "magic, uuid, layout hash, epoch" in out


def test_doctor_without_cxl_or_manifest_says_what_was_not_checked() -> None:
    out = _cli("doctor", "--root", str(FIXTURES / "nocxl"), "--allow-no-cxl")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "No CXL found on this host" in text
    assert "not checked: " in text and "cxl (" in text and "dax (" in text
    assert "no manifest: pass -f rack.yaml --host H" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("✓ No issues found in the ") and "skipped)" in last
    assert "✓ No issues found." not in text  # the bare claim is gone when most checks were skipped
