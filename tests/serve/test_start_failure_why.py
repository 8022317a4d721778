"""A failed start always says why: never an empty `why:` line, even with an empty log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.supervisor import StartFailed, Supervisor, exit_why


def test_exit_why_with_an_empty_or_blank_edged_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert exit_why("x exited with status 1", str(log)) == f"x exited with status 1; its log {log} is empty"
    log.write_text("\n\n")
    assert exit_why("x exited", str(log)).endswith("is empty")
    log.write_text("\n=== starting x\nboom\n\n")
    why = exit_why("x exited", str(log))
    assert why.splitlines()[0] == f"x exited; the last lines of {log}:"
    assert why.splitlines()[1:] == ["=== starting x", "boom"]


@pytest.mark.process
@pytest.mark.parametrize("code", ["import sys; sys.exit(4)", "import sys; print(); sys.exit(4)"])
def test_a_process_that_exits_silently_still_gets_a_why(tmp_path: Path, code: str) -> None:
    spec = ProcessSpec(
        name="vllm-0", kind="vllm", argv=(sys.executable, "-c", code), env={},
        log_file=str(tmp_path / "vllm-0.log"), health_url="http://127.0.0.1:9/health", ready_timeout_s=20,
    )  # fmt: skip
    sup = Supervisor(ServePlan("rack", "host", "rack.yaml", str(tmp_path), "pool", [spec]), say=lambda _: None,
                     poll_s=0.05)  # fmt: skip
    with pytest.raises(StartFailed) as info:
        sup.start()
    why = info.value.why or ""
    assert why.splitlines()[0].startswith("vllm-0 exited with status 4")
