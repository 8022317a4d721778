"""Shared helpers for the discovery tests: the fixture trees and their snapshots (read once)."""

from __future__ import annotations

import functools
from pathlib import Path

from belugactl.host.host import Host
from belugactl.host.snapshot import HostSnapshot
from belugactl.workflows.discover import discover

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TREES = ("lab-guest", "beluga-intel", "amd-host", "nocxl")  # hand-written, values asserted one by one
# Every tree, recorded ones included (e.g. lab-guest-recorded from `discover --capture` in the lab).
ALL_TREES = tuple(sorted(p.name for p in FIXTURES.iterdir() if (p / ".belugactl").is_dir()))


def tree(name: str) -> Path:
    return FIXTURES / name


def host(name: str) -> Host:
    return Host.from_tree(tree(name))


@functools.cache
def snapshot(name: str) -> HostSnapshot:
    """Discovery of a fixture tree; snapshots are frozen, so sharing one between tests is safe."""
    return discover(host(name))


def without_root(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "root"}
