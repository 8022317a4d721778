"""SIGTERM exits promptly at any size without losing what must be written: the server decides to leave
its index's objects to the process's exit (frozen for the GC, no per-object teardown), while the journal
it wrote as it went is complete; a journal that has to stop fails a real server's /readyz."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

LONG_NS = "n" * 200  # long records: the small rack's 2 MiB journal fills after a few thousand blocks


def _tracked(obj: object) -> bool:
    """Whether the cyclic GC would walk `obj` in a collection (frozen objects are left out)."""
    return any(o is obj for o in gc.get_objects())


def test_the_index_is_left_to_the_exit_not_torn_down(pool_path: Path) -> None:
    pool = PoolMapping.open(pool_path)
    server = MetadataServer(pool, ServerConfig(rpc_port=None, admin_port=None, restart_policy="journal"))
    server.start()
    ns = server.index.open_namespace("m/tp0")
    for i in range(50):
        token, _ = server.index.reserve(ns, i.to_bytes(4, "little") * 8, 4096)
        server.index.commit(token, checksum=zeros_crc(4096))
    assert not _tracked(server.index.entries)  # the start froze what the rebuild made (none here: the maps)
    first = next(iter(server.index.entries.values()))
    assert gc.is_tracked(first) and _tracked(first)
    server.housekeeping()  # each tick freezes what survived: no full collection walks the index
    assert not _tracked(first)
    ns2 = server.index.open_namespace("m/tp1")
    token, _ = server.index.reserve(ns2, b"k" * 32, 4096)
    server.index.commit(token, checksum=zeros_crc(4096))
    late = server.index.entries[(ns2, b"k" * 32)]
    assert _tracked(late)
    server.close()  # ... and so does the stop: nothing left for the exit's collection to walk
    assert not _tracked(late)
    pool.close()


def _start(manifest_path: Path, pool_path: Path) -> tuple[subprocess.Popen[str], dict]:
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest_path), "--pool", str(pool_path),
            "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json",
            "--restart-policy", "journal"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # noqa: S603
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def _save(pool: PoolMapping, ns: str, n: int, tag: bytes = b"") -> None:
    c = connect(f"cxl://{pool.path}#1", pool=pool, timeout_s=30)
    crc = zeros_crc(4096)
    for start in range(0, n, 100):
        got = c.reserve_many(ns, [(tag + i.to_bytes(4, "little") * 8, 4096) for i in range(start, min(n, start + 100))])
        c.commit_many([(r.token, crc) for r in got if not isinstance(r, int)])
    c.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.process
def test_sigterm_exits_cleanly_and_the_next_start_restores_every_commit(manifest_path: Path, pool_path: Path) -> None:
    proc, record = _start(manifest_path, pool_path)
    try:
        pool = PoolMapping.open(pool_path)
        _save(pool, "m/tp0", 300)
        code, err = _stop(proc)
        assert code == 0 and "metadata server: stopped" in err
        proc, record = _start(manifest_path, pool_path)
        assert record["restored_entries"] == 300
        assert _stop(proc)[0] == 0
        pool.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.process
def test_a_journal_that_fills_fails_readyz_and_says_so_in_metrics(manifest_path: Path, pool_path: Path) -> None:
    proc, record = _start(manifest_path, pool_path)
    try:
        admin = record["admin"]
        assert _get(f"{admin}/readyz")[0] == 200
        pool = PoolMapping.open(pool_path)
        _save(pool, LONG_NS, 5000)
        status, body = 0, ""
        for _ in range(100):  # the snapshot is refreshed by the loop's housekeeping
            status, body = _get(f"{admin}/readyz")
            if status == 503:
                break
            time.sleep(0.1)
        assert status == 503 and json.loads(body)["reason"].startswith("journal stopped:")
        metrics = ""
        for _ in range(100):  # /metrics reads the snapshot of the next housekeeping tick
            metrics = _get(f"{admin}/metrics")[1]
            if "beluga_mds_journal_stopped 1.0" in metrics:
                break
            time.sleep(0.1)
        assert "beluga_mds_journal_stopped 1.0" in metrics
        assert _stop(proc)[0] == 0
        pool.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
