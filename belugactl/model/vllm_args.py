"""The vLLM arguments in `serve.vllm.extra_args` that change how many processes an instance runs.

The pool layout allots one CXL-RPC ring per vLLM process (model/layout.py), counted from the
manifest's `gpus_per_instance` (serve passes it as --tensor-parallel-size). An extra argument that
changes the process count behind the layout's back would put two processes on one ring, so the
manifest rules refuse it; this module only finds such arguments, as vLLM's parser would read them
(`--name value`, `--name=value`, short aliases, underscores for dashes).
"""

from __future__ import annotations

from dataclasses import dataclass

# canonical long name -> what it multiplies
PROCESS_COUNT_FLAGS = {
    "--tensor-parallel-size": "tensor-parallel workers",
    "--pipeline-parallel-size": "pipeline stages (each stage has its own workers)",
    "--prefill-context-parallel-size": "prefill context-parallel workers",
    "--data-parallel-size": "data-parallel engines (each with its own scheduler and workers)",
    "--data-parallel-size-local": "data-parallel engines on this host",
}
ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
}


@dataclass(frozen=True)
class ParallelArg:
    index: int  # of the flag in extra_args
    flag: str  # canonical long name
    value: int | None  # None: missing or not an integer
    value_index: int  # of the value (the flag's own index for --name=value)


def _canonical(name: str) -> str | None:
    if name in ALIASES:
        return ALIASES[name]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
        if name in PROCESS_COUNT_FLAGS:
            return name
    return None


def parallel_args(extra_args: list[str]) -> list[ParallelArg]:
    """Every process-count argument in `extra_args`, in order (vLLM keeps the last of each)."""
    found: list[ParallelArg] = []
    i = 0
    while i < len(extra_args):
        arg = extra_args[i]
        name, eq, inline = arg.partition("=")
        flag = _canonical(name)
        if flag is None:
            i += 1
            continue
        if eq:
            text, value_index, step = inline, i, 1
        elif i + 1 < len(extra_args):
            text, value_index, step = extra_args[i + 1], i + 1, 2
        else:
            text, value_index, step = "", i, 1
        value = int(text) if text.strip().isdigit() else None
        found.append(ParallelArg(i, flag, value, value_index))
        i += step
    return found
