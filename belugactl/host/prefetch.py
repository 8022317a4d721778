"""Run a known set of tool invocations concurrently, ahead of the readers that ask for them.

Discovery starts up to ten short-lived processes (tool versions, `cxl list` x4, `ndctl list`,
`daxctl list`), each of which mostly waits: on process start-up, on sysfs walks inside the tool.
`prefetched(host, jobs)` starts them all at once on a small thread pool and puts a runner in front
of the host's runner that hands each result out once, to the first reader asking for the same
argv; anything else goes straight through. Readers stay sequential and unaware of it.

Thread safety: the pool only calls the wrapped runner's `run`, which for SubprocessRunner is
`subprocess.run` and for the recording/recorded runners a dict lookup or a list append.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from belugactl.host.command_runner import CommandResult, Runner
from belugactl.host.host import Host

MAX_WORKERS = 8


class PrefetchingRunner:
    """Gives out results of commands started ahead; runs everything else with the wrapped runner."""

    def __init__(self, inner: Runner, pending: dict[tuple[str, ...], Future[CommandResult]]) -> None:
        self.inner = inner
        self._pending = pending

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        if input is None:
            future = self._pending.pop(tuple(argv), None)
            if future is not None:
                return future.result()
        return self.inner.run(argv, timeout=timeout, input=input)


@contextmanager
def prefetched(host: Host, jobs: Sequence[tuple[Sequence[str], float]]) -> Iterator[Host]:
    """Within the block, `host.run(argv)` for each (argv, timeout) in `jobs` returns the result of a run
    already started concurrently. The host's runner is put back afterwards; runs nobody asked for
    are still waited for (they are short, and a process must not outlive discovery)."""
    inner = host.runner
    unique: dict[tuple[str, ...], float] = {}
    for argv, timeout in jobs:
        unique.setdefault(tuple(argv), timeout)
    if len(unique) < 2:
        yield host
        return
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(unique)), thread_name_prefix="discover") as pool:
        pending = {argv: pool.submit(inner.run, argv, timeout=timeout) for argv, timeout in unique.items()}
        host.runner = PrefetchingRunner(inner, pending)
        try:
            yield host
        finally:
            host.runner = inner
