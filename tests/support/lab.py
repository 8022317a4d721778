"""Helpers shared by the lab tests (the ones that boot QEMU guests)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import belugactl

BELUGACTL = [sys.executable, "-m", "belugactl"]
REPO = Path(belugactl.__file__).resolve().parent.parent


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"lab prerequisites missing in CI: {reason}")
    pytest.skip(f"lab prerequisites missing: {reason}")


def run_cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [*BELUGACTL, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )


def our_qemus(state: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and b"qemu-system" in args[0] and any(str(state).encode() in a for a in args):
            found.append(int(entry.name))
    return found
