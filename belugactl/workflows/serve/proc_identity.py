"""Which process a recorded pid really is, and signals that reach only that process.

A pid alone names a process only while it lives: after it exits the kernel hands the number to
the next process that starts. `serve` records each process it starts as (pid, start time, command
line, executable) and every signal `stop`, `status` and the supervisor send is preceded by a check
that the pid still belongs to that process:

- the start time decides: two processes with one pid never share a start time within a boot. It is
  compared as the kernel keeps it, clock ticks since boot (`/proc/PID/stat` field 22) within one
  boot id. psutil's wall-clock `create_time` is that plus the boot time, and the boot time the
  kernel reports (`btime` in /proc/stat) is derived from the current clock, so it moves by a second
  when NTP steps the clock: two processes (serve's supervisor and a later `belugactl status`) can
  see one process's create_time a second apart. The wall-clock time is kept for reports and for
  state files written before ticks were recorded, where it is compared with a tight tolerance
  (a mismatch there only reads as "not running", never as a signal to the wrong process);
- the command line must match too, or, where a process renamed itself (vLLM sets process titles),
  the executable must. A recorded entry without an identity (a state file from an older belugactl)
  is never signalled.

All of that can be copied from /proc by whoever writes a state file, so `stop` believes a state
file only in a run dir of its own user's, and a matching process only when it also holds one of
that run dir's files open (its log as stdout, the supervisor's lock): run_dir.py.

The single-process signal goes through a pidfd, which pins the process between the check and the
signal. A process group has no pidfd; `signal_group` relies on the kernel never reusing an id as a
pid while a process group of that id exists: a process found at the leader's pid that is not the
recorded leader means our group is empty, and nothing is sent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

# psutil derives create_time from clock ticks (10 ms); allow for float rounding, nothing more.
_START_TOLERANCE_S = 0.02


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: float  # seconds since the epoch (psutil's create_time)
    cmdline: tuple[str, ...]
    exe: str | None = None
    start_ticks: int | None = None  # /proc/PID/stat starttime: clock ticks since boot
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id: the boot those ticks count from

    @classmethod
    def of(cls, pid: int | None) -> ProcessIdentity | None:
        """The identity of the process that has `pid` now; None when there is none (or it is a zombie)."""
        import psutil

        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                start = proc.create_time()
                try:
                    cmdline = tuple(proc.cmdline())
                except psutil.AccessDenied:
                    cmdline = ()
                try:
                    exe = proc.exe() or None
                except psutil.AccessDenied:
                    exe = None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        return cls(pid, start, cmdline, exe, _start_ticks(pid), _boot_id())

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "cmdline": list(self.cmdline),
            "exe": self.exe,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ProcessIdentity | None:
        """Tolerant of anything a state file may hold: a malformed entry is no identity at all."""
        if not isinstance(data, dict):
            return None
        pid, start, cmdline, exe = data.get("pid"), data.get("start_time"), data.get("cmdline"), data.get("exe")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        if not isinstance(start, int | float) or isinstance(start, bool):
            return None
        if not isinstance(cmdline, list) or not all(isinstance(x, str) for x in cmdline):
            return None
        ticks, boot = data.get("start_ticks"), data.get("boot_id")
        return cls(
            pid,
            float(start),
            tuple(cmdline),
            exe if isinstance(exe, str) else None,
            ticks if isinstance(ticks, int) and not isinstance(ticks, bool) and ticks >= 0 else None,
            boot if isinstance(boot, str) and boot else None,
        )

    def matches(self, current: ProcessIdentity | None) -> bool:
        """Whether `current` (what holds this pid now) is the process this identity recorded."""
        if current is None or current.pid != self.pid:
            return False
        if self._same_clock(current):
            if current.start_ticks != self.start_ticks:
                return False
        elif abs(current.start_time - self.start_time) > _START_TOLERANCE_S:
            return False
        if current.cmdline == self.cmdline:
            return True
        return self.exe is not None and current.exe == self.exe

    def _same_clock(self, current: ProcessIdentity) -> bool:
        """Both start times are in ticks of one boot, so they compare exactly."""
        return (
            self.start_ticks is not None
            and current.start_ticks is not None
            and self.boot_id is not None
            and self.boot_id == current.boot_id
        )


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': fields after the last
    # ')' start at field 3 (state), so starttime (field 22) is the 20th of them.
    rest = raw[raw.rfind(b")") + 1 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def is_running(identity: ProcessIdentity | None) -> bool:
    """The recorded process still runs (not a zombie, not another process that got its pid)."""
    return identity is not None and identity.matches(ProcessIdentity.of(identity.pid))


def signal_process(identity: ProcessIdentity | None, sig: int) -> bool:
    """Send `sig` to exactly the recorded process; False (nothing sent) when it is gone or its pid was reused."""
    if identity is None:
        return False
    try:
        fd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (a kernel before 5.3): check, then signal by pid
        if not is_running(identity):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, sig)
        return True
    try:
        # The pidfd refers to whatever held the pid when it was opened; if that is our process now,
        # the signal below cannot reach anything else, however fast the pid is recycled.
        if not is_running(identity):
            return False
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, sig)
        return True
    finally:
        os.close(fd)


def group_is_ours(identity: ProcessIdentity) -> bool:
    """Whether a signal to the process group `identity.pid` can reach only our processes."""
    current = ProcessIdentity.of(identity.pid)
    if current is None:
        # No process holds the leader's pid: either the group is gone (killpg finds nothing) or members
        # of our group are left (the kernel does not reuse a pid while a group of that id exists).
        return True
    if not identity.matches(current):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        return os.getpgid(identity.pid) == identity.pid
    return False


def signal_group(identity: ProcessIdentity | None, sig: int) -> bool:
    """Send `sig` to the process group our recorded process leads; False when that is not provably ours."""
    if identity is None or not group_is_ours(identity):
        return False
    try:
        os.killpg(identity.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate(
    identity: ProcessIdentity | None, *, grace_s: float = 20.0, poll_s: float = 0.1, sig: int = signal.SIGTERM
) -> bool:
    """Signal our process group (SIGTERM, or SIGUSR1 for HAProxy's drain), wait up to `grace_s` for its
    leader, then SIGKILL what is left.

    Returns whether anything was signalled. Nothing is ever sent to a pid that is not provably ours.
    """
    if identity is None or not signal_group(identity, sig):
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_running(identity):
        time.sleep(poll_s)
    signal_group(identity, signal.SIGKILL)
    return True
