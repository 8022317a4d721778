"""Ctrl-C (SIGINT) anywhere: exit 130 and one line on stderr, "interrupted: <command>; <state left>"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.errors import set_interrupt_note

REPO = Path(__file__).resolve().parents[2]


def _interrupted_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "interrupted" in line]


@pytest.mark.process
@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_a_command_waits_for_its_input(tmp_path: Path, as_json: bool) -> None:
    fifo = tmp_path / "rack.yaml"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "belugactl", "manifest", "check", "-f", str(fifo), *(["--json"] if as_json else [])]
    env = {**os.environ, "BELUGACTL_INPUT_TIMEOUT": "300"}  # the read's own deadline must not end it first
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    writer: list[int] = []
    # Opening the FIFO for writing returns once the command has it open: it is then waiting for bytes.
    opener = threading.Thread(target=lambda: writer.append(os.open(fifo, os.O_WRONLY)), daemon=True)
    opener.start()
    opener.join(timeout=60)
    try:
        assert writer, "the command never opened its manifest"
        os.write(writer[0], b"name: half-a-manifest\n")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if not writer:  # unblock the opener thread
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        for fd in writer:
            os.close(fd)
    assert proc.returncode == 130, err
    assert _interrupted_lines(err) == ["interrupted: belugactl manifest check; it only reads, nothing was changed"]
    assert "Traceback" not in err
    if as_json:
        doc = json.loads(out)
        assert doc["ok"] is False and doc["schema_version"] == 1
        assert doc["error"]["code"] == 130 and doc["error"]["kind"] == "interrupted"
    else:
        assert out == ""


def test_the_line_says_the_state_the_command_left(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import belugactl.workflows.doctor as doctor

    def interrupted_midway(*_a: object, **_k: object) -> None:
        set_interrupt_note("3 step(s) applied (the last: dax.mode) and recorded")
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "run_doctor", interrupted_midway)
    assert run(["doctor", "--root", str(REPO / "tests" / "fixtures" / "beluga-intel")]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert _interrupted_lines(err) == [
        "interrupted: belugactl doctor; 3 step(s) applied (the last: dax.mode) and recorded"
    ]
    # the note belongs to that command line only
    monkeypatch.setattr(doctor, "run_doctor", lambda *_a, **_k: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert run(["pool", "show", "-f", str(REPO / "examples" / "cpu-demo.yaml"), "--json"]) == 0
    capsys.readouterr()
    assert run(["doctor", "--root", str(REPO / "tests" / "fixtures" / "beluga-intel")]) == 130
    assert _interrupted_lines(capsys.readouterr().err) == [
        "interrupted: belugactl doctor; it only reads, nothing was changed"
    ]


def test_setup_says_which_step_it_was_in_and_what_it_had_applied(lab1, monkeypatch) -> None:
    """Interrupted inside its second step, setup's note names that step and the one applied before it."""
    from belugactl.errors import clear_interrupt_notes, current_interrupt_note
    from belugactl.workflows.setup import applier
    from tests.support.fake_machine import lab_target

    real_execute, calls = applier.execute, []

    def execute(ctx, action):  # type: ignore[no-untyped-def]
        calls.append(action)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_execute(ctx, action)

    monkeypatch.setattr(applier, "execute", execute)
    clear_interrupt_notes()
    with pytest.raises(KeyboardInterrupt):
        applier.run_setup(lab1.host, lab_target())
    assert current_interrupt_note() == (
        "step devdax.create was running (1 step(s) applied before it); setup re-plans from the host when run again"
    )
    clear_interrupt_notes()
