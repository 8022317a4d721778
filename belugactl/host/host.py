"""The Host object: one root directory plus one command runner.

On a real machine the root is `/` and the runner runs processes. In tests the root is a fixture
tree (or an unpacked `discover --capture` archive) and the runner replays recorded tool output.
Readers in `belugactl.host` only ever go through this object, so swapping it swaps the machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from belugactl.host.command_runner import CommandResult, RecordedRunner, Runner, SubprocessRunner

# Where a captured tree keeps the recorded tool outputs, relative to its root.
CAPTURE_COMMANDS = ".belugactl/commands.json"
CAPTURE_META = ".belugactl/capture.json"


class Host:
    def __init__(self, root: Path | str = "/", runner: Runner | None = None, *, trace: bool = False) -> None:
        self.root = Path(root)
        self.runner: Runner = runner if runner is not None else SubprocessRunner()
        # Paths read through this object, kept when tracing so `discover --capture` can pack them.
        self.trace = trace
        self.files_read: set[str] = set()

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def local(cls) -> Host:
        return cls("/", SubprocessRunner())

    @classmethod
    def from_tree(cls, root: Path | str) -> Host:
        """A captured or hand-written tree: files under `root`, tool outputs in its commands.json."""
        root = Path(root)
        commands = root / CAPTURE_COMMANDS
        runner = RecordedRunner.load(commands) if commands.exists() else RecordedRunner()
        return cls(root, runner)

    @property
    def is_live(self) -> bool:
        return str(self.root) == "/"

    # --- files --------------------------------------------------------------------------------
    def path(self, p: str) -> Path:
        """Map an absolute machine path (`/sys/bus/cxl`) into this host's root."""
        return self.root / p.lstrip("/")

    def _note(self, p: str) -> None:
        if self.trace:
            self.files_read.add("/" + p.lstrip("/"))

    def exists(self, p: str) -> bool:
        return self.path(p).exists()

    def is_dir(self, p: str) -> bool:
        return self.path(p).is_dir()

    def read_text(self, p: str) -> str | None:
        """File contents, or None when missing or unreadable (sysfs files can refuse reads)."""
        try:
            text = self.path(p).read_text(errors="replace")
        except (OSError, ValueError):
            return None
        self._note(p)
        return text

    def read_str(self, p: str) -> str | None:
        text = self.read_text(p)
        return text.strip() if text is not None else None

    def read_int(self, p: str, base: int = 0) -> int | None:
        """Integers as sysfs writes them: decimal, or hex with 0x (base 0 accepts both)."""
        text = self.read_str(p)
        if text is None or text == "":
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def read_bytes(self, p: str, size: int = -1, offset: int = 0) -> bytes | None:
        try:
            with open(self.path(p), "rb") as fh:
                if offset:
                    fh.seek(offset)
                data = fh.read(size)
        except OSError:
            return None
        self._note(p)
        return data

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []

    def readlink(self, p: str) -> str | None:
        try:
            return os.readlink(self.path(p))
        except OSError:
            return None

    def resolve(self, p: str) -> str | None:
        """The machine path a (sysfs) symlink resolves to, kept inside this host's root."""
        try:
            real = os.path.realpath(self.path(p))
        except OSError:
            return None
        root = os.path.realpath(self.root)
        if root == "/":
            return real
        if real != root and not real.startswith(root + os.sep):
            return None
        return "/" + os.path.relpath(real, root) if real != root else "/"

    def stat(self, p: str) -> os.stat_result | None:
        try:
            return os.stat(self.path(p))
        except OSError:
            return None

    # --- writes (only `workflows` decide to call these; a plan shows them first) -------------
    def write_text(self, p: str, text: str) -> None:
        """Write a file (sysfs attribute, /proc/mtrr, a udev rule) under this host's root."""
        with open(self.path(p), "w") as fh:
            fh.write(text)

    # --- commands -----------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        return self.runner.run(argv, timeout=timeout, input=input)
