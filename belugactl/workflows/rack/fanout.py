"""Fan a command out to many hosts with ClusterShell, argv lists all the way.

ClusterShell gives us the sliding-window fanout, per-node timeouts, per-node exit codes and output
grouping that a hand-written loop would get wrong. Its stock local worker runs string commands
through a shell, so we plug in a client that always builds an argv list: the transport decides
how a host is reached (OpenSSH, the emulated lab's exec channel, or a plain local process in tests).
The one unavoidable string is the remote command line that OpenSSH hands to the remote shell; it
is produced by `shlex.join` from an argv list, never by formatting.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ClusterShell.Event import EventHandler
from ClusterShell.NodeSet import NodeSet
from ClusterShell.Task import Task, task_self
from ClusterShell.Worker.Exec import ExecClient, ExecWorker

from belugactl.errors import ExitCode

# OpenSSH reports its own failures (refused, timeout, auth) with 255.
SSH_TRANSPORT_FAILURE = 255


@dataclass
class NodeResult:
    host: str
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0
    unreachable: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.unreachable

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "unreachable": self.unreachable,
            "duration_s": round(self.duration_s, 3),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


class Transport:
    """How a host is reached: turns (host, remote argv) into a local argv."""

    name = "abstract"
    #: exit status that means "could not reach the host" rather than "the command failed"
    unreachable_rc: int | None = None

    def argv(self, host: str, remote: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def is_unreachable(self, returncode: int | None, stdout: str) -> bool:
        """Whether this exit means the transport never reached the host (not that the command failed)."""
        return self.unreachable_rc is not None and returncode == self.unreachable_rc

    def address(self, host: str) -> str:
        """What the transport dials for `host` (for messages)."""
        return host


@dataclass
class SshTransport(Transport):
    """OpenSSH in batch mode: never prompts, bounded connect time, honours ~/.ssh/config or `-F`."""

    ssh_path: str = "ssh"
    config_file: str | None = None
    user: str | None = None
    connect_timeout_s: int = 10
    addresses: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    identity_file: str | None = None
    extra_options: list[str] = field(default_factory=list)
    name = "ssh"
    unreachable_rc = SSH_TRANSPORT_FAILURE

    def argv(self, host: str, remote: Sequence[str]) -> list[str]:
        cmd = [self.ssh_path]
        if self.config_file:
            cmd += ["-F", self.config_file]
        cmd += [
            "-oBatchMode=yes",
            f"-oConnectTimeout={self.connect_timeout_s}",
            "-oForwardAgent=no",
            "-oForwardX11=no",
            # a host that hangs (rather than dies) is noticed in ~15 s, not at the command timeout
            "-oServerAliveInterval=5",
            "-oServerAliveCountMax=3",
        ]
        if self.identity_file:
            cmd += ["-i", self.identity_file, "-oIdentitiesOnly=yes"]
        if host in self.ports:
            cmd += ["-p", str(self.ports[host])]
        if self.user:
            cmd += ["-l", self.user]
        cmd += self.extra_options
        cmd += [self.addresses.get(host, host), "--", shlex.join(list(remote))]
        return cmd

    def address(self, host: str) -> str:
        return self.addresses.get(host, host)


@dataclass
class CommandTransport(Transport):
    """A local program that runs a command "on" a host: `belugactl lab exec HOST -- ...`, or tests.

    `prefix` may contain the placeholder "{host}", replaced by the host name (whole argument only).
    """

    prefix: list[str]
    name = "command"
    unreachable_rc: int | None = None

    def argv(self, host: str, remote: Sequence[str]) -> list[str]:
        return [host if part == "{host}" else part for part in self.prefix] + list(remote)


@dataclass
class LabTransport(CommandTransport):
    """`belugactl lab exec --name LAB HOST -- ...`: a guest of the emulated rack."""

    lab_name: str = "default"
    name = "lab"

    def is_unreachable(self, returncode: int | None, stdout: str) -> bool:
        # `lab exec` exits 3 with nothing on stdout when the lab is down or the guest is not running; the
        # rack's per-host commands run with --json, so their own exit 3 always prints a document.
        return returncode == ExitCode.ENVIRONMENT and not stdout.strip()


class Progress(Protocol):
    """What a rack command tells while hosts answer (the CLI draws it: `cli/rack_progress.py`)."""

    def phase(self, name: str, hosts: Sequence[str]) -> None:
        """A fan-out named `name` starts on `hosts`."""

    def answered(self, name: str, result: NodeResult) -> None:
        """One host's command of that fan-out ended (or timed out)."""


class NoProgress:
    """Reports nothing: the library's default, and tests."""

    def phase(self, name: str, hosts: Sequence[str]) -> None:
        pass

    def answered(self, name: str, result: NodeResult) -> None:
        pass


class _ArgvClient(ExecClient):
    def _build_cmd(self):  # type: ignore[override]
        # A list (not a str) makes ClusterShell start the process without a shell.
        return (self.worker.argv_for(str(self.key)), None)


class _ArgvWorker(ExecWorker):
    SHELL_CLASS = _ArgvClient

    def __init__(
        self, nodes: NodeSet, handler: EventHandler, argv_for: Callable[[str], list[str]], timeout: float | None
    ) -> None:
        self.argv_for = argv_for
        # The command string is never executed; it only tells ExecWorker to create shell clients.
        super().__init__(nodes, handler, timeout=timeout, command="belugactl-argv", stderr=True)


class _Collector(EventHandler):
    """Each host's result as its command ends, handed to `on_result` right away (progress)."""

    def __init__(self, transport: Transport, on_result: Callable[[NodeResult], None] | None) -> None:
        self.transport = transport
        self.on_result = on_result
        self.started: dict[str, float] = {}
        self.results: dict[str, NodeResult] = {}

    def ev_pickup(self, worker, node):  # noqa: D401 - ClusterShell callback
        self.started[str(node)] = time.monotonic()

    def ev_hup(self, worker, node, rc):
        host = str(node)
        self.results[host] = self.result(worker, host, rc, timed_out=False)
        if self.on_result is not None:
            self.on_result(self.results[host])

    def result(self, worker: ExecWorker, host: str, rc: int | None, *, timed_out: bool) -> NodeResult:
        out = worker.node_buffer(host)
        err = worker.node_error(host)
        stdout = out.decode(errors="replace") if isinstance(out, bytes) else str(out or "")
        started = self.started.get(host)
        return NodeResult(
            host=host,
            returncode=rc,
            stdout=stdout,
            stderr=err.decode(errors="replace") if isinstance(err, bytes) else str(err or ""),
            timed_out=timed_out,
            duration_s=(time.monotonic() - started) if started is not None else 0.0,
            unreachable=not timed_out and self.transport.is_unreachable(rc, stdout),
        )


def fan_out(
    hosts: Sequence[str],
    remote_argv: Callable[[str], list[str]],
    transport: Transport,
    *,
    fanout: int = 16,
    timeout_s: float = 300.0,
    task: Task | None = None,
    on_result: Callable[[NodeResult], None] | None = None,
) -> dict[str, NodeResult]:
    """Run `remote_argv(host)` on every host through `transport`; results keyed by host, in input order.

    `on_result` gets each host's result as soon as its command ends (timed-out hosts when the run ends)."""
    if not hosts:
        return {}
    task = task or task_self()
    task.set_info("fanout", max(1, fanout))
    handler = _Collector(transport, on_result)
    nodes = NodeSet.fromlist(list(hosts))
    worker = _ArgvWorker(nodes, handler, lambda h: transport.argv(h, remote_argv(h)), timeout_s)
    task.schedule(worker)
    task.run()
    timed_out = {str(n) for n in worker.iter_keys_timeout()}
    results: dict[str, NodeResult] = {}
    for host in hosts:
        if host in timed_out or host not in handler.results:
            rc = None if host in timed_out else _retcode(worker, host)
            late = handler.result(worker, host, rc, timed_out=host in timed_out)
            handler.results[host] = late
            if on_result is not None:
                on_result(late)
        results[host] = handler.results[host]
    return results


def _retcode(worker: ExecWorker, host: str) -> int | None:
    try:
        return worker.node_retcode(host)
    except KeyError:  # ClusterShell has no exit status for a host whose command never ended
        return None


def group_identical(results: dict[str, NodeResult]) -> list[tuple[list[str], NodeResult]]:
    """clush -b: hosts whose output and status are identical are shown once, as a node set."""
    groups: dict[tuple[int | None, bool, str, str], list[str]] = {}
    for host, res in results.items():
        groups.setdefault((res.returncode, res.timed_out, res.stdout, res.stderr), []).append(host)
    return [(hosts, results[hosts[0]]) for hosts in groups.values()]


def fold(hosts: Sequence[str]) -> str:
    """Fold host names the way operators write them: gpu[01-16]."""
    return str(NodeSet.fromlist(list(hosts)))
