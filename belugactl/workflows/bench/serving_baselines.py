"""vLLM's ExampleConnector as a baseline beside the pool: one instance with B's argv, KV in files.

Per round it answers the prompt once (its connector saves the prompt's KV to files) and then again
under another `cache_salt`: vLLM's local prefix cache keys blocks with the salt, so it cannot answer
the second request, while the ExampleConnector keys its files by the token ids alone and finds them.
One instance suffices that way (a second instance sharing the storage path, or a prefix-cache reset
through vLLM's dev endpoint, would cost another engine start or need VLLM_SERVER_DEV_MODE), and the
hit runs in the very engine that saved, as B's local hit does.

Where the connector fails (under chunked prefill it saves only the first chunk's KV, under a name
that covers the whole prompt, so the load does not fit: a shape mismatch in the worker), the
request fails and the engine dies; the reason comes from the instance's log and the row says
"fails: <reason>" instead of a number. Later rounds do not retry a dead engine.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.errors import BelugaError
from belugactl.workflows.serve.traffic import Completion, complete, prompt_token_sources

_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)$")
# Errors that only say the engine is gone, not why
_GENERIC = ("EngineDeadError", "EngineCore encountered an issue", "Engine core proc", "APIServer")


@dataclass
class ExampleInstance:
    port: int
    log_file: str | None = None
    failed: str | None = None  # why, once it failed: later rounds are not tried
    notes: list[str] = field(default_factory=list)


def log_size(path: str | None) -> int:
    try:
        return Path(path).stat().st_size if path else 0
    except OSError:
        return 0


def failure_reason(error: BaseException, log_file: str | None, since: int = 0) -> str:
    """The most specific error the instance logged since `since` (its traceback's last line that
    names an error and is not just "the engine is dead"), else the request's own error."""
    text = ""
    if log_file:
        try:
            with open(log_file, "rb") as fh:
                fh.seek(since)
                text = fh.read().decode(errors="replace")
        except OSError:
            text = ""
    found = []
    for line in text.splitlines():
        m = _ERROR_LINE.search(line.strip())
        if m and not any(g in line for g in _GENERIC):
            found.append(f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}")
    if found:
        return found[-1][:300]
    what = getattr(error, "what", None) or str(error)
    why = getattr(error, "why", None)
    return (f"{what} ({why})" if why else str(what))[:300]


def _external(port: int) -> float | None:
    try:
        return prompt_token_sources(port).get("external_kv_transfer", 0.0)
    except OSError:
        return None


def example_round(
    inst: ExampleInstance,
    prompt: list[int],
    *,
    salt_save: str,
    salt_hit: str,
    settle_s: float,
) -> dict[str, Any]:
    """Save then hit one prompt; {"status": "ok", "save_s", "hit_s", "tokens", "loaded_tokens"} or
    {"status": "fails", "reason"}."""
    if inst.failed is not None:
        return {"status": "fails", "reason": inst.failed}
    answers: dict[str, Completion] = {}
    loaded = None
    for kind, salt in (("save", salt_save), ("hit", salt_hit)):
        time.sleep(settle_s)
        before = _external(inst.port) if kind == "hit" else None
        mark = log_size(inst.log_file)
        try:
            answers[kind] = complete(inst.port, prompt, max_tokens=1, cache_salt=salt)
        except BelugaError as exc:
            inst.failed = failure_reason(exc, inst.log_file, since=mark)
            return {"status": "fails", "reason": inst.failed, "failed_on": kind}
        if kind == "hit":
            after = _external(inst.port)
            if before is not None and after is not None:
                loaded = after - before
    if loaded is not None and loaded <= 0:
        # It answered, but from a full prefill: that is no connector hit to put beside the pool's.
        inst.failed = "no hit: vLLM counted no tokens from the connector on the second request"
        return {"status": "fails", "reason": inst.failed, "failed_on": "hit"}
    return {
        "status": "ok",
        "save_s": answers["save"].seconds,
        "hit_s": answers["hit"].seconds,
        "tokens": answers["hit"].tokens,
        "loaded_tokens": loaded,
    }
