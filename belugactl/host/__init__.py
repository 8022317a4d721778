"""The only code that touches a machine: files under a root directory and commands through a runner."""

from belugactl.host.host import Host
from belugactl.host.runner import CommandResult, RecordedRunner, RecordingRunner, Runner, SubprocessRunner

__all__ = ["CommandResult", "Host", "RecordedRunner", "RecordingRunner", "Runner", "SubprocessRunner"]
