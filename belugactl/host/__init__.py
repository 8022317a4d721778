"""The only code that touches a machine: files under a root directory and commands through a runner."""

from belugactl.host.command_runner import CommandResult, RecordedRunner, RecordingRunner, Runner, SubprocessRunner
from belugactl.host.host import Host

__all__ = ["CommandResult", "Host", "RecordedRunner", "RecordingRunner", "Runner", "SubprocessRunner"]
