"""A minimal QMP client for a lab guest's QEMU monitor socket (lab/qemu.py:qmp_socket).

One command per connection: read the greeting, enter command mode (`qmp_capabilities`), send the
command, and return its `return` value, skipping the asynchronous events QEMU may send meanwhile. An
`error` reply raises QmpError with QEMU's class (e.g. CommandNotFound on a QEMU without the command).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any


class QmpError(Exception):
    def __init__(self, klass: str, desc: str) -> None:
        super().__init__(f"{klass}: {desc}")
        self.klass, self.desc = klass, desc


def _reply(f: Any, deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        line = f.readline()
        if not line:
            raise ConnectionError("QEMU closed its QMP socket")
        msg = json.loads(line)
        if "return" in msg or "error" in msg or "QMP" in msg:
            return msg
    raise TimeoutError("no QMP reply in time")


def qmp_command(path: Path | str, execute: str, arguments: dict[str, Any] | None = None,
                timeout: float = 10.0) -> Any:  # fmt: skip
    """Run one QMP command on the monitor at `path`; its return value."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        # Closed before the socket: QEMU serves one monitor client at a time, the next once this one is gone.
        with sock.makefile("rw", encoding="utf-8", newline="\n") as f:
            _reply(f, deadline)  # the greeting
            for cmd, args in (("qmp_capabilities", None), (execute, arguments)):
                f.write(json.dumps({"execute": cmd, **({"arguments": args} if args else {})}) + "\n")
                f.flush()
                msg = _reply(f, deadline)
                if "error" in msg:
                    err = msg["error"]
                    raise QmpError(str(err.get("class")), str(err.get("desc")))
            return msg.get("return")
