"""Builds the optional native helper `belugactl.dataplane._native` (everything else is in pyproject.toml).

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
        f"\n{bar}\nWARNING: belugactl's native helper (belugactl/dataplane/_native.c) did not build:\n  {exc}\n"
        "belugactl installs and works on a single host without it, but multi-host CXL coherence\n"
        "(cache-line flushes, non-temporal stores) needs it or an uncacheable (MTRR UC) pool.\n"
        f"Install a C compiler and the Python headers (python3-dev), then reinstall.\n{bar}\n",
        file=sys.stderr,
    )


ext_modules = []
if os.environ.get("BELUGACTL_NO_NATIVE") != "1":
    ext_modules.append(
        Extension(
            "belugactl.dataplane._native",
            sources=["belugactl/dataplane/_native.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
