"""Requests to running vLLM instances: token-id prompts, greedy, timed. Used by `bench serve` and tests.

TTFT is measured as the latency of a one-token completion: the prefill plus one sampling step,
which is what the pool saves. Longer generations use `max_tokens`.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from belugactl.errors import EnvironmentProblem


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    seconds: float
    prompt_tokens: int
    logprobs: list[float]  # of each generated token, when asked for


def token_prompt(length: int, *, seed: int, vocab: int = 1024) -> list[int]:
    """A reproducible prompt of token ids in [3, vocab) (low ids are often special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def served_model(port: int, *, timeout: float = 5.0, address: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{address}:{port}/v1/models", timeout=timeout) as resp:  # noqa: S310
        return json.loads(resp.read())["data"][0]["id"]


def complete(
    port: int,
    prompt: list[int],
    *,
    max_tokens: int = 1,
    model: str | None = None,
    use_pool: bool = True,
    logprobs: bool = False,
    timeout: float = 300.0,
    cache_salt: str | None = None,
    address: str = "127.0.0.1",
) -> Completion:
    """Greedy completion of a token-id prompt; `use_pool=False` turns the Beluga connector off for it.

    `cache_salt` (vLLM's own field) joins the first block's hash: with prefix caching on, only a
    request with the same salt can hit the blocks another left in the local cache. It changes the
    Beluga keys too (they are those hashes), so a pool hit needs the salt its writer used."""
    body: dict[str, Any] = {
        "model": model or served_model(port, address=address),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    if logprobs:  # needs the tokenizer: not with --skip-tokenizer-init
        body["logprobs"] = 1
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if not use_pool:
        body["kv_transfer_params"] = {"beluga": {"load": False, "save": False}}
    request = urllib.request.Request(  # noqa: S310 - loopback URL built here
        f"http://{address}:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise EnvironmentProblem(
            f"vLLM on port {port} refused a completion: HTTP {exc.code}", why=exc.read().decode(errors="replace")[:500]
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise EnvironmentProblem(f"vLLM on port {port} did not answer: {exc}", fix="belugactl status") from None
    seconds = time.perf_counter() - started
    choice = doc["choices"][0]
    scores = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or []) if x is not None]
    return Completion(
        list(choice.get("token_ids") or []), seconds, int((doc.get("usage") or {}).get("prompt_tokens", 0)), scores
    )


def prompt_token_sources(port: int, *, timeout: float = 5.0, address: str = "127.0.0.1") -> dict[str, float]:
    """vLLM's own count of prompt tokens by where their KV came from (local_compute,
    local_cache_hit, external_kv_transfer), summed over engines, from its /metrics."""
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=timeout) as resp:  # noqa: S310
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:prompt_tokens_by_source"):
            continue
        labels, _, value = line.rpartition(" ")
        marker = 'source="'
        if marker not in labels:
            continue
        source = labels.split(marker, 1)[1].split('"', 1)[0]
        out[source] = out.get(source, 0.0) + float(value)
    return out


def complete_all(
    port: int,
    prompts: Sequence[list[int]],
    *,
    use_pool: bool = True,
    cache_salt: str | None = None,
    model: str | None = None,
    timeout: float = 600.0,
) -> tuple[list[Completion], float]:
    """Send every prompt at once (one connection each) and return the answers in order and the
    wall time from the first send to the last answer."""
    name = model or served_model(port)
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        started = time.perf_counter()
        futures = [
            pool.submit(complete, port, p, model=name, use_pool=use_pool, cache_salt=cache_salt, timeout=timeout)
            for p in prompts
        ]
        answers = [f.result() for f in futures]
        return answers, time.perf_counter() - started
