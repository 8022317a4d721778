"""`belugactl top` as a person uses it: in a terminal (a detached tmux pane, 100x30), read off the screen
with `tmux capture-pane`, keys typed with `tmux send-keys`.

Real parts: a metadata-server process on a file pool, HAProxy running the config `serve` writes (when
installed; CI has it), and `belugactl top` itself. No vLLM runs here: its instances show as down with
the reason, which is what an operator sees while they start or after a crash.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.model.manifest import load_manifest
from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.serve.router import haproxy_config
from tests.support.mds_process import start_mds
from tests.support.top_rack import top_rack

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
NS = "top/tp0"
# The pane's command: run argv on the pane's terminal, then write its exit status to a file. A Ctrl-C
# reaches both (one process group): this wrapper waits on; ignoring SIGINT instead would pass the
# ignore on to the child, whose Ctrl-C would then do nothing.
RECORD_EXIT = """
import subprocess, sys
child = subprocess.Popen(sys.argv[2:])
while True:
    try:
        rc = child.wait()
        break
    except KeyboardInterrupt:
        pass
open(sys.argv[1], "w").write(str(rc))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rack(admin_port: int, port_base: int, router: str) -> str:
    return top_rack("top-tmux", admin_port, port_base, router)


@contextmanager
def haproxy(manifest_path: Path, run_dir: Path) -> Iterator[bool]:
    """The front door serve would start, from the same config; yields False where HAProxy is missing."""
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("haproxy is not installed (scripts/bootstrap installs the Debian package)")
        yield False
        return
    run_dir.mkdir()
    config = run_dir / "haproxy.cfg"
    config.write_text(haproxy_config(load_manifest(manifest_path), run_dir))
    proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        yield True
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Pane:
    """One tmux server of its own (-L), one session running the command, 100 columns by 30 rows."""

    def __init__(self, socket_name: str, conf: Path) -> None:
        self.tmux = ["tmux", "-L", socket_name, "-f", str(conf)]

    def start(self, argv: list[str], exit_file: Path) -> None:
        """Run argv in the pane; its exit status lands in `exit_file` (tmux's own #{pane_dead_status}
        is sometimes left empty by tmux 3.3 here, the child unreaped)."""
        # COLUMNS/LINES emptied: the pane's own size must decide, not the test runner's environment
        subprocess.run(  # noqa: S603
            [*self.tmux, "new-session", "-d", "-x", "100", "-y", "30", "-s", "top", "-c", str(REPO),
             "-e", "COLUMNS=", "-e", "LINES=", sys.executable, "-c", RECORD_EXIT, str(exit_file), *argv],
            check=True,
        )  # fmt: skip

    def screen(self) -> str:
        out = subprocess.run([*self.tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True)  # noqa: S603
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", "top", *keys], check=True)  # noqa: S603

    def kill(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)  # noqa: S603

    def wait_for(self, pred: Callable[[str], bool], what: str, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.screen()
            if pred(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what}; it shows:\n{text}")
            time.sleep(0.05)


def _skip_without_tmux() -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed (scripts/bootstrap installs it)")
        pytest.skip("tmux is not installed (apt-get install tmux)")


def _wait_for_file(path: Path, timeout_s: float = 10.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text() if path.exists() else None


def _line(text: str, start: str) -> str:
    return next((line for line in text.splitlines() if line.startswith(start)), "")


def _table_hosts(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line.split()[:1] in (["h0"], ["h1"])]


def test_top_in_a_terminal_shows_the_rack_updates_and_answers_its_keys(tmp_path: Path) -> None:
    _skip_without_tmux()
    from belugactl.dataplane.client import connect

    vllm_port, router_port, stats_port = _free_port(), _free_port(), _free_port()
    router = f"router: {{port: {router_port}, stats_port: {stats_port}, check_interval_ms: 200}}"
    server_rack = tmp_path / "server.yaml"
    server_rack.write_text(_rack(9470, vllm_port, router))
    pool = create_file_pool(tmp_path / "pool.bin", load_manifest(server_rack))
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\nset -g status off\n")  # keep the exit status; all 30 rows are the view
    pane = Pane(f"belugactl-top-{os.getpid()}-{tmp_path.name}", conf)
    with start_mds(server_rack, pool, "--fence-grace", "0") as mds:
        # top reads the admin port from the manifest: the one the server got from the kernel
        rack = tmp_path / "rack.yaml"
        rack.write_text(_rack(int(mds.record["admin"].rsplit(":", 1)[1]), vllm_port, router))
        with haproxy(rack, tmp_path / "run") as has_router:
            try:
                exit_file = tmp_path / "exit-status"
                pane.start([sys.executable, "-m", "belugactl", "top", "-f", str(rack), "--interval", "0.3"], exit_file)
                first = pane.wait_for(lambda t: "entries 0" in t and "h1" in t, "the server's figures")
                assert "metadata  h0 127.0.0.1:" in first and "up, epoch" in first
                assert "hosts 2: 0 up, 2 down (h[0-1])" in first
                assert "down: connection refused" in _line(first, "h1 ")
                if has_router:
                    pane.wait_for(lambda t: "backends 0/4 up" in t, "the front door's backends, all down")

                # puts and gets through the server: the next scrapes show them
                client = connect(mds.tcp, timeout_s=5)
                keys = [os.urandom(32) for _ in range(20)]
                for key in keys:
                    client.commit(client.reserve(NS, key, 65536).token, 0x1234)
                for key in keys[:15]:
                    loc = client.get(NS, key)
                    assert loc is not None
                    client.release([loc.lease_id])
                client.close()
                pane.wait_for(lambda t: "entries 20" in t and "1.2 MiB of 40.0 MiB" in t, "the 20 blocks")

                pane.keys("s")
                pane.wait_for(lambda t: "sort state" in _line(t, "belugactl top"), "the next sort column")
                pane.keys("/", "h", "1")
                shown = pane.wait_for(lambda t: "filter hosts: h1_" in t, "the filter being typed")
                shown = pane.wait_for(lambda t: _table_hosts(t) == ["h1", "h1"], "only h1's instances")
                pane.keys("Enter")
                shown = pane.wait_for(lambda t: "keys: s sort" in t, "the keys line after Enter")
                assert "2 of 4 instances (host filter 'h1')" in shown
                pane.keys("q")
                assert _wait_for_file(exit_file) == "0", f"q did not end top with 0; the screen:\n{pane.screen()}"
            finally:
                pane.kill()


def test_ctrl_c_in_top_is_exit_130_with_the_interrupt_line(tmp_path: Path) -> None:
    """The terminal's cbreak mode keeps Ctrl-C a signal: top ends like every command (exit 130, one line)."""
    _skip_without_tmux()
    rack = tmp_path / "rack.yaml"
    rack.write_text(_rack(_free_port(), _free_port(), ""))  # nothing answers: every endpoint is down
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g remain-on-exit on\nset -g status off\n")
    pane = Pane(f"belugactl-top-{os.getpid()}-{tmp_path.name}", conf)
    exit_file = tmp_path / "exit-status"
    try:
        pane.start([sys.executable, "-m", "belugactl", "top", "-f", str(rack), "--interval", "0.3"], exit_file)
        pane.wait_for(lambda t: "down: connection refused" in _line(t, "h1 "), "the instances, down")
        pane.keys("C-c")
        assert _wait_for_file(exit_file) == "130", pane.screen()
        after = pane.screen()
        assert "interrupted: belugactl top; it only reads, nothing was changed" in after
        assert "belugactl top  rack" not in after  # the full-screen view is gone, the shell's screen is back
    finally:
        pane.kill()
