"""Fixtures for the data-plane tests: a small rack manifest and a file-backed pool.

Tests of the native helper carry the `native` marker. They are always collected: without the
helper they are skipped with a visible reason, and in CI (`CI=true`) they fail instead, so the C
paths can never go untested silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from belugactl.dataplane import native

NATIVE_MISSING = "the native helper is not built (python setup.py build_ext --inplace)"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("native") is None or native._native is not None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{NATIVE_MISSING}; CI must build it and run these tests", pytrace=False)
    pytest.skip(NATIVE_MISSING)


class NativeImpl:
    """The native twin of a set of functions, looked up when a test uses it (it may not be built)."""

    def __getitem__(self, name: str):
        return getattr(native._native, name)


def native_param(value=None, *, id: str = "native"):  # noqa: A002 - pytest's own keyword
    """A parametrize case for the native implementation: present whether or not it is built."""
    return pytest.param(NativeImpl() if value is None else value, id=id, marks=pytest.mark.native)

SMALL_RACK = """\
version: 1
name: dp-test
pool:
  source: {kind: cxl-region, memdevs: all, type: ram}
  size: 64MiB
  align: 2MiB
layout:
  metadata: {slots_per_ring: 8, slot_size: 256B, spare_rings: 2, journal: 2MiB}
  shared_kv: 40MiB
  partition_size: equal
hosts:
  - name: h0
    address: 10.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {cpu_nodes: 1, cxl_nodes: 1}
    gpus: {count: 2, model: L40S}
  - name: h1
    address: 10.0.0.2
    roles: [worker]
    platform: gpu
    numa: {cpu_nodes: 1, cxl_nodes: 1}
    gpus: {count: 2, model: L40S}
serve:
  vllm:
    model: Qwen/Qwen2.5-7B-Instruct
    instances_per_host: 2
"""


@pytest.fixture
def rack_text() -> str:
    return SMALL_RACK


@pytest.fixture
def manifest_path(tmp_path: Path) -> Path:
    path = tmp_path / "rack.yaml"
    path.write_text(SMALL_RACK)
    return path


@pytest.fixture
def manifest(manifest_path: Path):
    from belugactl.model.manifest import load_manifest

    return load_manifest(manifest_path)


@pytest.fixture
def pool_path(tmp_path: Path, manifest) -> Path:
    from belugactl.pool.file_pool import create_file_pool

    return create_file_pool(tmp_path / "pool.bin", manifest)
