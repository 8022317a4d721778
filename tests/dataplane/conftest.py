"""The data-plane tests' native marker (the small rack and its file pool are tests/conftest.py's).

Tests of the native helper carry the `native` marker. They are always collected: without the
helper they are skipped with a visible reason, and in CI (`CI=true`) they fail instead, so the C
paths can never go untested silently.
"""

from __future__ import annotations

import os

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
