"""`belugactl serve` in the foreground: Ctrl-C (SIGINT) stops everything and exits 130 with one line
saying so; SIGTERM, a service manager's stop, stops everything and exits 0 (issue 34 item 5)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.workflows.serve.control import read_state
from belugactl.workflows.serve.launch_plan import ProcessSpec
from belugactl.workflows.serve.supervisor import pid_alive
from tests.support import FAKE_SERVICE
from tests.support.paths import CPU_DEMO

pytestmark = pytest.mark.process

# The real CLI and supervisor; only the launch plan is a small fake service instead of vLLM.
SERVE = """
import json, sys
from belugactl.workflows.serve import control
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
specs = [ProcessSpec(**d) for d in json.loads(sys.argv[1])]
plan = ServePlan("cpu-demo", "host", sys.argv[3], sys.argv[2], "/tmp/pool", specs)
control.prepare = lambda rack, **_: control.Prepared(plan)
from belugactl.cli.app import main
main(["serve", "-f", sys.argv[3], "--skip-doctor", "--run-dir", sys.argv[2]])
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("signame", "code"), [("SIGINT", 130), ("SIGTERM", 0)])
def test_serve_exits_130_on_ctrl_c_and_0_on_sigterm(tmp_path: Path, signame: str, code: int) -> None:
    port = _port()
    spec = ProcessSpec(
        name="metadata-server", kind="metadata", argv=(sys.executable, str(FAKE_SERVICE), str(port), "ok"),
        env={}, log_file=str(tmp_path / "logs" / "metadata-server.log"), port=port,
        health_url=f"http://127.0.0.1:{port}/health", ready_timeout_s=20.0,
    )  # fmt: skip
    specs = [dict(spec.to_dict(), argv=list(spec.argv), gpus=[])]
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", SERVE, json.dumps(specs), str(tmp_path), str(CPU_DEMO)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # until serve says it is ready (or it ends)
            seen.append(line)
            if "all ready" in line:
                break
        assert "all ready" in "".join(seen), "".join(seen)
        pids = [p["pid"] for p in read_state(tmp_path)["processes"]]
        proc.send_signal(getattr(signal, signame))
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    err = "".join(seen) + rest
    assert proc.returncode == code, err
    assert not any(pid_alive(pid) for pid in pids)
    assert read_state(tmp_path)["state"] == "stopped"
    interrupted = [line for line in err.splitlines() if line.startswith("interrupted:")]
    if signame == "SIGINT":
        assert interrupted == [
            f"interrupted: belugactl serve; serve stopped everything it started (metadata-server); "
            f"state {tmp_path} says stopped"
        ]
    else:
        assert interrupted == []
    assert "Traceback" not in err
