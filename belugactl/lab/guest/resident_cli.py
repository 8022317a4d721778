"""A resident belugactl inside a lab guest that forks one child per command (lab only).

Under TCG every guest CPU instruction is emulated, and a cold `belugactl doctor` spends most of its
50 s importing Python modules (typer, pydantic, rich, yaml and the workflows). This process imports
them once, at boot, then serves the guest agent over a unix socket: for each `belugactl ...`
request it forks, the child takes the request's stdin/stdout/stderr files, working directory,
environment and argv, runs the CLI exactly as the `belugactl` script would, and exits with its code.
Real hosts never use it: it is started by the lab's guest agent only.

Protocol (one connection per command, JSON lines):
  agent -> {"argv": [...], "env": {...}, "cwd": "...", "stdin": path, "stdout": path, "stderr": path}
  resident -> {"pid": N}        the child's pid (its own process group: the agent kills it on timeout)
  resident -> {"rc": R}         when the child has exited (as a shell reports it: 128+N for signal N)

The server is single-threaded (forking a threaded process is unsafe), reaps children without
blocking, and serves any number of commands at once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import selectors
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

# What `belugactl doctor`, `setup`, `plan`, `discover` and the rack probe import; anything missing
# is simply imported later by the child that needs it.
PRELOAD = (
    "belugactl.cli.app",
    "belugactl.cli.render",
    "belugactl.cli.load_rack",
    "belugactl.model.manifest",
    "belugactl.model.layout",
    "belugactl.workflows.discover",
    "belugactl.host.host",
    "belugactl.workflows.doctor",
    "belugactl.workflows.doctor.checks",
    "belugactl.workflows.setup.planner",
    "belugactl.workflows.setup.applier",
    "belugactl.workflows.setup.execute",
    "belugactl.workflows.rack.orchestrate",
    "belugactl.pool.mapping",
    "belugactl.pool.header",
    "rich.console",
    "rich.table",
    "yaml",
    "pydantic",
)
MAX_REQUEST = 1 << 20
REAP_EVERY_S = 0.05


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import what the commands need; return the modules that failed (the child imports them itself)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that fails here fails again, visibly, in the child
            failed.append(name)
    return failed


def _exit_status(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8


def import_cli(repo_root: str) -> Callable[..., Any] | None:
    """Build the CLI once and run two harmless commands, so that what typer, click and pydantic import
    lazily on a command's first parse is imported here, before any fork. Returns the click command."""
    import gc

    try:
        import typer.main

        from belugactl.cli.app import build_app, run

        command = typer.main.get_command(build_app())
        example = os.path.join(repo_root, "examples", "lab.yaml")
        saved = os.dup(1), os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            os.dup2(null, 2)
            for argv in (["manifest", "check", "-f", example, "--json"], ["doctor", "--help"]):
                with contextlib.suppress(BaseException):
                    run(argv, command=command)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, null):
                os.close(fd)
    except Exception:  # noqa: BLE001 - without it each child builds the CLI itself
        command = None
    # Children touch (and so copy) fewer pages when the collector never walks the inherited heap.
    gc.collect()
    gc.freeze()
    return command


def _child(request: dict, command: Callable[..., Any] | None = None) -> None:
    """In the forked child: become the command, run it, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        for fd, key, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
            path = request.get(key) or os.devnull
            new = os.open(path, mode)
            os.dup2(new, fd)
            os.close(new)
        os.chdir(request.get("cwd") or "/")
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
        argv = [str(a) for a in request["argv"]]
        sys.argv = ["belugactl", *argv]
        from belugactl.cli.app import run

        code = run(argv, command=command)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught exception in the script would: traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


class ResidentServer:
    def __init__(self, path: str, command: Callable[..., Any] | None = None) -> None:
        self.path = path
        self.command = command
        self.children: dict[int, socket.socket] = {}
        self.listener: socket.socket | None = None
        self.selector = selectors.DefaultSelector()

    def listen(self) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)  # the socket runs commands as root: root only
        try:
            sock.bind(self.path + ".tmp")
        finally:
            os.umask(old)
        sock.listen(64)
        os.replace(self.path + ".tmp", self.path)  # appears only once it accepts
        self.listener = sock
        return sock

    def serve_forever(self, sock: socket.socket) -> None:
        self.selector.register(sock, selectors.EVENT_READ)
        while True:
            for _key, _ in self.selector.select(REAP_EVERY_S):
                with contextlib.suppress(OSError):
                    conn, _ = sock.accept()
                    self._start(conn)
            self._reap()

    def _start(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        try:
            request = json.loads(_read_line(conn))
            if not isinstance(request, dict) or not isinstance(request.get("argv"), list):
                raise ValueError("a request needs an argv list")
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps({"error": str(exc)}) + "\n").encode())
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            # The child keeps only its own connection's fd (closed too: the parent answers on it).
            self.selector.close()
            for other in [*self.children.values(), conn, *([self.listener] if self.listener else [])]:
                with contextlib.suppress(OSError):
                    other.close()
            _child(request, self.command)
        # If the agent went away, the child still runs to its end and is reaped.
        with contextlib.suppress(OSError):
            conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
        self.children[pid] = conn

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall((json.dumps({"rc": _rc(status)}) + "\n").encode())
                conn.close()


def _rc(status: int) -> int:
    code = _exit_status(status)
    return 128 - code if code < 0 else code


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("request too large")
    return data.decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    start = time.monotonic()
    failed = preload()
    import belugactl

    root = os.path.dirname(os.path.dirname(os.path.abspath(belugactl.__file__)))
    command = import_cli(root)
    info = {"ready_s": round(time.monotonic() - start, 2), "root": root, "python": sys.executable, "pid": os.getpid(),
            "preload_failed": failed,
            "cli_prebuilt": command is not None}
    # The agent reads this before routing a request here: which checkout this process runs.
    with open(args.socket + ".json.tmp", "w") as fh:
        json.dump(info, fh)
    os.replace(args.socket + ".json.tmp", args.socket + ".json")
    server = ResidentServer(args.socket, command)
    sock = server.listen()
    print(json.dumps(info), flush=True)
    server.serve_forever(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
