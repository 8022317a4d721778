"""The engines `bench serve` starts: serve's own plan under one engine setting, and the vLLM
ExampleConnector instance beside it (same argv as instance B but for the port and the KV transfer
config), so every baseline runs the same model, the same engine settings and the same prompts.

Two engine settings (issue 12): vLLM's default chunked prefill (2048 tokens a step on this CPU
build) and `--max-num-batched-tokens 4096`, where a 4000-token prompt is prefilled in one step.
Instance B gets vLLM's prefix cache turned on (the demo manifest turns it off): the local
prefix-cache hit is the floor the pool hit is measured against, and `cache_salt` keeps the
recompute and the pool hit out of that cache (workflows/bench/serving.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import socket
from pathlib import Path

from belugactl.errors import UsageError
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan

# setting name -> --max-num-batched-tokens (None: vLLM's own default)
ENGINE_SETTINGS: dict[str, int | None] = {"default": None, "4096": 4096}
EXAMPLE_CONNECTOR = "ExampleConnector"


def parse_settings(text: str) -> list[str]:
    """`default`, `4096` or `both` -> the settings to run, in order."""
    if text == "both":
        return list(ENGINE_SETTINGS)
    if text in ENGINE_SETTINGS:
        return [text]
    raise UsageError(
        f"--engine-setting {text}: unknown",
        why=f"expected one of {', '.join([*ENGINE_SETTINGS, 'both'])}",
        fix="--engine-setting default|4096|both",
    )


def describe(setting: str) -> str:
    tokens = ENGINE_SETTINGS.get(setting)
    return "default chunked prefill" if tokens is None else f"--max-num-batched-tokens {tokens}"


def _drop_option(argv: list[str], name: str, *, takes_value: bool) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == name:
            skip = takes_value
            continue
        if takes_value and arg.startswith(name + "="):
            continue
        out.append(arg)
    return out


def prefix_caching_on(argv: tuple[str, ...] | list[str]) -> bool:
    """vLLM's prefix cache is on unless the last of the two flags turns it off."""
    flags = [a for a in argv if a in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
    return not flags or flags[-1] == "--enable-prefix-caching"


def engine_argv(
    argv: tuple[str, ...] | list[str], *, max_batched_tokens: int | None, prefix_caching: bool | None = None
) -> tuple[str, ...]:
    """`argv` with `--max-num-batched-tokens` set to the setting (removed for vLLM's default) and,
    where `prefix_caching` is given, the prefix cache on or off."""
    out = _drop_option(list(argv), "--max-num-batched-tokens", takes_value=True)
    if max_batched_tokens is not None:
        out += ["--max-num-batched-tokens", str(max_batched_tokens)]
    if prefix_caching is not None:
        out = _drop_option(out, "--enable-prefix-caching", takes_value=False)
        out = _drop_option(out, "--no-enable-prefix-caching", takes_value=False)
        out.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    return tuple(out)


def plan_for_setting(plan: ServePlan, setting: str, *, local_cache_on: str | None) -> ServePlan:
    """serve's plan with every vLLM instance under `setting` and the prefix cache on for the
    instance named `local_cache_on` (B: the local hit is measured there)."""
    tokens = ENGINE_SETTINGS[setting]
    out = copy.copy(plan)
    out.processes = [
        dataclasses.replace(
            p,
            argv=engine_argv(
                p.argv, max_batched_tokens=tokens, prefix_caching=True if p.name == local_cache_on else None
            ),
        )
        if p.kind == "vllm"
        else p
        for p in plan.processes
    ]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def example_connector_spec(b: ProcessSpec, *, port: int, storage: Path, log_file: Path) -> ProcessSpec:
    """vLLM with its ExampleConnector (files under `storage`), argv as B's but for the port and the
    KV transfer config; no Beluga stats."""
    argv = _drop_option(list(b.argv), "--port", takes_value=True)
    argv = _drop_option(argv, "--kv-transfer-config", takes_value=True)
    config = {
        "kv_connector": EXAMPLE_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    # vllm serve MODEL: keep the subcommand and model first, as serve's plan has them
    head = 3 if len(argv) >= 3 and argv[1] == "serve" else 1
    argv = [*argv[:head], "--port", str(port), "--kv-transfer-config", json.dumps(config), *argv[head:]]
    return dataclasses.replace(
        b,
        name="vllm-example",
        argv=tuple(argv),
        log_file=str(log_file),
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        stats_prefix=None,
    )


def example_plan(plan: ServePlan, spec: ProcessSpec, run_dir: Path) -> ServePlan:
    """A plan of the ExampleConnector instance alone, in its own run dir (its own state file: the
    bench supervises it apart from serve, so stopping it never touches serve's processes)."""
    return ServePlan(plan.rack, plan.host, plan.manifest, str(run_dir), plan.pool_path, [spec])
