"""Builds the optional native helper `belugactl.dataplane._native` and its counting twin for tests
(`_native_counting`; everything else is in pyproject.toml).

The helper needs a C compiler and Python headers. Where the build fails, installation still
succeeds: the package then runs without it and says loudly, at run time, that multi-host
coherence needs it (or an uncacheable pool). Set BELUGACTL_NO_NATIVE=1 to skip the build.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure means "no helper", never "no install"
            _warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _warn(exc)


def _warn(exc: BaseException) -> None:
    bar = "!" * 78
    print(
        f"\n{bar}\nWARNING: belugactl's native helper (belugactl/dataplane/_native_*.c) did not build:\n  {exc}\n"
        "belugactl installs and works on a single host without it, but multi-host CXL coherence\n"
        "(cache-line flushes, non-temporal stores) needs it or an uncacheable (MTRR UC) pool.\n"
        f"Install a C compiler and the Python headers (python3-dev), then reinstall.\n{bar}\n",
        file=sys.stderr,
    )


NATIVE_DIR = "belugactl/dataplane"
# One extension from several C files, one concern each (see _native_module.c).
NATIVE_SOURCES = sorted(
    f"{NATIVE_DIR}/{name}" for name in os.listdir(NATIVE_DIR) if name.startswith("_native") and name.endswith(".c")
)
NATIVE_HEADERS = sorted(
    f"{NATIVE_DIR}/{name}" for name in os.listdir(NATIVE_DIR) if name.startswith("_native") and name.endswith(".h")
)


def _write_wire_header() -> None:
    """Regenerate _native_wire.h from rpc/protocol.py, so the C constants cannot drift from Python.

    The committed copy is used when the generator cannot run (a test checks the two agree)."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from belugactl.dataplane.rpc.wire_header import render

        text = render()
    except Exception as exc:  # noqa: BLE001 - fall back to the committed header
        print(f"setup.py: could not regenerate {NATIVE_DIR}/_native_wire.h ({exc}); using the committed one")
        return
    path = f"{NATIVE_DIR}/_native_wire.h"
    if os.path.exists(path):
        with open(path) as fh:
            old = fh.read()
    else:
        old = None
    if old != text:
        with open(path, "w") as fh:
            fh.write(text)


ext_modules = []
if os.environ.get("BELUGACTL_NO_NATIVE") != "1":
    _write_wire_header()
    ext_modules.append(
        Extension(
            "belugactl.dataplane._native",
            sources=NATIVE_SOURCES,
            depends=NATIVE_HEADERS,
            extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"],
            optional=True,
        )
    )
    # The same sources again, recording every flush, non-temporal store and fence
    # (_native_count.c): tests load it in place of _native to see that the bytes are made visible.
    ext_modules.append(
        Extension(
            "belugactl.dataplane._native_counting",
            sources=NATIVE_SOURCES,
            depends=NATIVE_HEADERS,
            define_macros=[("BELUGA_COUNT_FLUSHES", "1")],
            extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
