"""The host side of the exec channel: put a request into a guest's spool, stream its output back.

See `belugactl.lab.guest.agent` for the spool layout. Output is streamed while the command runs; its
exit status comes back unchanged (a command killed by signal N reports 128+N, a timeout 124).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from belugactl.errors import BelugaError, EnvironmentProblem
from belugactl.host.command_runner import CommandResult

RC_TIMEOUT = 124
# How long past the command's own timeout the host waits for the agent to report it.
GRACE_S = 15.0


class GuestUnavailable(EnvironmentProblem):
    """The guest's agent cannot take or finish a command (not booted, crashed, hung)."""


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False
    resident: bool = False  # run by the guest's resident CLI (belugactl.lab.guest.resident_cli), not spawned


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _Tail:
    """Follows a file that another process appends to, handing on each new chunk."""

    def __init__(self, path: Path, sink: BinaryIO | None) -> None:
        self.path = path
        self.sink = sink
        self.pos = 0
        self.kept = bytearray()

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                chunk = fh.read()
        except OSError:
            return
        if not chunk:
            return
        self.pos += len(chunk)
        if self.sink is None:
            self.kept += chunk
        else:
            self.sink.write(chunk)
            self.sink.flush()


class GuestChannel:
    """Runs commands in one guest through its spool directory (a host path)."""

    def __init__(self, spool: Path, *, name: str = "guest", alive: Callable[[], bool] | None = None) -> None:
        self.spool = Path(spool)
        self.name = name
        self.alive = alive

    def ready_info(self) -> dict[str, object] | None:
        try:
            return json.loads((self.spool / "ready").read_text())
        except (OSError, ValueError):
            return None

    def heartbeat_age(self) -> float | None:
        try:
            return max(0.0, time.time() - (self.spool / "heartbeat").stat().st_mtime)
        except OSError:
            return None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 300.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> ExecResult:
        """Run `argv` in the guest. With `stdout`/`stderr` given, output streams there as it comes;
        otherwise it is collected into the result."""
        if isinstance(argv, str) or not argv:
            raise TypeError("argv must be a non-empty list")
        if self.ready_info() is None:
            raise GuestUnavailable(
                f"{self.name} is not ready for commands",
                why=f"its agent has not announced itself in {self.spool}",
                fix="belugactl lab status; belugactl lab up",
            )
        req_id = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
        work = self.spool / "out" / req_id
        work.mkdir(parents=True)
        if stdin is not None:
            (work / "stdin").write_bytes(stdin)
        request = {"argv": list(argv), "timeout": timeout, "cwd": cwd, "env": env or {}}
        start = time.monotonic()
        _write_atomic(self.spool / "req" / f"{req_id}.json", json.dumps(request).encode())
        out, err = _Tail(work / "stdout", stdout), _Tail(work / "stderr", stderr)
        status_file = work / "status.json"
        deadline = start + timeout + GRACE_S
        next_alive_check = start + 0.5
        try:
            while True:
                out.pump()
                err.pump()
                if status_file.exists():
                    status = json.loads(status_file.read_text())
                    out.pump()
                    err.pump()
                    return ExecResult(
                        int(status.get("rc", 1)),
                        bytes(out.kept),
                        bytes(err.kept),
                        float(status.get("duration_s", time.monotonic() - start)),
                        bool(status.get("timed_out", False)),
                        bool(status.get("resident", False)),
                    )
                now = time.monotonic()
                if now > deadline:
                    self._cancel(req_id)
                    raise GuestUnavailable(
                        f"{self.name} did not finish `{' '.join(argv)}` within {timeout:g} s",
                        why="the guest agent gave no result (the guest may be hung or overloaded)",
                        fix=f"belugactl lab status; look at the console log next to {self.spool}",
                    )
                if self.alive is not None and now >= next_alive_check:
                    next_alive_check = now + 0.5
                    if not self.alive():
                        raise GuestUnavailable(
                            f"{self.name} stopped while running `{' '.join(argv)}`",
                            why="its QEMU process is gone (crashed or killed)",
                            fix="belugactl lab status; belugactl lab down && belugactl lab up",
                        )
                time.sleep(0.02 if now - start < 2 else 0.05)
        except BaseException:
            self._cancel(req_id)
            # Give the agent a moment to kill the command and report, so its folder can go too.
            settle = time.monotonic() + 3.0
            while not status_file.exists() and time.monotonic() < settle:
                time.sleep(0.05)
            raise
        finally:
            self._cleanup(req_id, work)

    def _cancel(self, req_id: str) -> None:
        try:
            (self.spool / "cancel").mkdir(exist_ok=True)
            (self.spool / "cancel" / req_id).write_text("cancel\n")
        except OSError:
            pass

    def _cleanup(self, req_id: str, work: Path) -> None:
        # A request still waiting in req/ was never claimed: withdraw it.
        (self.spool / "req" / f"{req_id}.json").unlink(missing_ok=True)
        if (work / "status.json").exists() or not (work / "request.json").exists():
            shutil.rmtree(work, ignore_errors=True)
            (self.spool / "cancel" / req_id).unlink(missing_ok=True)
        # else: the agent still runs it; it sees cancel/<id>, finishes, and the folder is left
        # for `lab down` to remove with the rest of the lab.


class GuestRunner:
    """A `belugactl.host.command_runner.Runner` whose commands run inside a lab guest."""

    def __init__(self, channel: GuestChannel, *, env: dict[str, str] | None = None) -> None:
        self.channel = channel
        self.env = env

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        args = tuple(str(a) for a in argv)
        try:
            result = self.channel.run(
                args, timeout=timeout, env=self.env, stdin=input.encode() if input is not None else None
            )
        except BelugaError:
            raise
        return CommandResult(
            args,
            result.returncode,
            result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
            result.duration_s,
            timed_out=result.timed_out,
            not_found=result.returncode == 127,
        )
