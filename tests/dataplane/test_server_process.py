"""The metadata server as a real process: several client processes over CXL-RPC and TCP, admin HTTP,
SIGKILL in the middle of puts, clean exits for a missing pool, a wrong header and a port in use."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import (
    AlreadyPresent,
    MetadataUnavailable,
    PoolFull,
    ReservationExpired,
    StaleEpoch,
)
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

pytestmark = pytest.mark.timeout(120)


@contextmanager
def server(manifest_path: Path, pool_path: Path, *extra: str) -> Iterator[dict]:
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest_path), "--pool", str(pool_path),
            "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json", *extra]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # noqa: S603
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, proc.stderr.read() if proc.stderr else "no output"
        record = json.loads(line)
        record["proc"] = proc
        yield record
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


CLIENT = textwrap.dedent(
    """
    import sys
    from belugactl.dataplane import native
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping
    address, pool_path, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    pool = PoolMapping.open(pool_path)
    c = connect(address, pool=pool if address.startswith("cxl") else None, timeout_s=5.0)
    for i in range(20):
        key = f"{tag}-{i}".encode().ljust(32, b".")
        r = c.reserve("m/tp0", key, 3000 + i)
        data = (key * 100)[: r.nbytes]
        pos = 0
        for off, n in r.extents:
            pool.write(off, data[pos : pos + n])
            pos += n
        c.commit(r.token, native.crc32c(data))
    print(c.lookup_prefix("m/tp0", [f"{tag}-{i}".encode().ljust(32, b".") for i in range(25)]))
    c.close()
    """
)


def read_block(pool: PoolMapping, extents: list[tuple[int, int]]) -> bytes:
    return b"".join(pool.read(off, n) for off, n in extents)


def test_several_client_processes_over_cxl_and_tcp(manifest_path: Path, pool_path: Path) -> None:
    with server(manifest_path, pool_path) as srv:
        addresses = {"a": f"cxl://{pool_path}#0", "b": f"cxl://{pool_path}#3", "c": srv["rpc"]}
        procs = {
            tag: subprocess.Popen(  # noqa: S603
                [sys.executable, "-c", CLIENT, addr, str(pool_path), tag], stdout=subprocess.PIPE, text=True
            )
            for tag, addr in addresses.items()
        }
        outputs = {tag: p.communicate(timeout=90)[0].strip() for tag, p in procs.items()}
        assert all(p.returncode == 0 for p in procs.values()), outputs
        assert outputs == {"a": "20", "b": "20", "c": "20"}
        pool = PoolMapping.open(pool_path)
        c = connect(srv["rpc"], timeout_s=5.0)
        for tag in addresses:
            for i in (0, 19):
                key = f"{tag}-{i}".encode().ljust(32, b".")
                loc = c.get("m/tp0", key)
                assert loc is not None and loc.nbytes == 3000 + i
                assert read_block(pool, loc.extents) == (key * 100)[: 3000 + i]
                c.release([loc.lease_id])
        assert c.stats()["entries"] == 60
        c.close()
        pool.close()
        srv["proc"].send_signal(signal.SIGTERM)
        assert srv["proc"].wait(timeout=10) == 0  # graceful


def test_two_phase_put_is_invisible_to_other_clients_until_commit(manifest_path: Path, pool_path: Path) -> None:
    with server(manifest_path, pool_path) as srv:
        writer = connect(f"cxl://{pool_path}#1", timeout_s=5.0)
        reader = connect(srv["rpc"], timeout_s=5.0)
        key = b"\x01" * 32
        r = writer.reserve("m/tp0", key, 100_000)
        assert reader.lookup_prefix("m/tp0", [key]) == 0 and reader.get("m/tp0", key) is None
        writer.commit(r.token, zeros_crc(r.nbytes))
        assert reader.lookup_prefix("m/tp0", [key]) == 1
        with pytest.raises(AlreadyPresent):
            reader.reserve("m/tp0", key, 10)
        with pytest.raises(PoolFull):
            writer.reserve("m/tp0", b"\x02" * 32, 1 << 40)
        other = writer.reserve("m/tp0", b"\x03" * 32, 4096)
        writer.abort(other.token)
        with pytest.raises(ReservationExpired):
            writer.commit(other.token, zeros_crc(other.nbytes))
        assert reader.lookup_prefix("m/tp0", [b"\x03" * 32]) == 0
        for client in (reader, writer):  # TCP and CXL
            locs = client.get_many("m/tp0", [key, b"\x09" * 32, key])
            assert locs[1] is None and locs[0] is not None and locs[0].extents == locs[2].extents
            client.release([loc.lease_id for loc in locs if loc])
        assert reader.delete("m/tp0", key) and writer.get("m/tp0", key) is None
        assert reader.clear_namespace("m/tp0") == 0
        writer.close()
        reader.close()


def test_admin_http_on_loopback(manifest_path: Path, pool_path: Path) -> None:
    with server(manifest_path, pool_path) as srv:
        assert srv["admin"].startswith("http://127.0.0.1:") and srv["rpc"].startswith("tcp://127.0.0.1:")
        c = connect(srv["rpc"], timeout_s=5.0)
        c.lookup_prefix("m/tp0", [b"x" * 32])
        c.close()
        base = srv["admin"]
        assert json.load(urllib.request.urlopen(base + "/healthz"))["status"] == "ok"
        ready = json.load(urllib.request.urlopen(base + "/readyz"))
        assert ready["ready"] and ready["restart_policy"] == "start-empty" and ready["epoch"] == srv["epoch"]
        import time

        time.sleep(0.3)  # one housekeeping tick refreshes the snapshot
        metrics = urllib.request.urlopen(base + "/metrics").read().decode()
        for name in ("beluga_mds_ops_total", "beluga_mds_pool_bytes", "beluga_mds_request_seconds_bucket",
                     "beluga_mds_evictions_total", "beluga_mds_reservations_reclaimed_total"):  # fmt: skip
            assert name in metrics, name
        stats = json.load(urllib.request.urlopen(base + "/stats"))
        assert stats["requests"]["by_op"]["LOOKUP_PREFIX"] >= 1 and stats["index"]["bytes_capacity"] > 0


def test_sigkill_mid_put_leaves_nothing_visible_and_fences_old_clients(manifest_path: Path, pool_path: Path) -> None:
    keys = [bytes([i]) * 32 for i in range(6)]
    with server(manifest_path, pool_path) as srv:
        old = connect(f"cxl://{pool_path}#2", timeout_s=2.0)
        old_tcp = connect(srv["rpc"], timeout_s=2.0)
        for k in keys[:5]:
            old.commit(old.reserve("m/tp0", k, 50_000).token, zeros_crc(50_000))
        half = old.reserve("m/tp0", keys[5], 50_000)  # written but never committed
        assert old_tcp.lookup_prefix("m/tp0", keys) == 5
        os.kill(srv["proc"].pid, signal.SIGKILL)
        srv["proc"].wait(timeout=10)
        with pytest.raises(MetadataUnavailable):
            old_tcp.lookup_prefix("m/tp0", keys)
    with server(manifest_path, pool_path) as srv2:
        assert srv2["epoch"] == srv["epoch"] + 1
        with pytest.raises(StaleEpoch):
            old.commit(half.token, zeros_crc(half.nbytes))
        with pytest.raises(StaleEpoch):
            old.lookup_prefix("m/tp0", keys)
        assert old.reconnect() == srv2["epoch"]
        assert old.lookup_prefix("m/tp0", keys) == 0  # no entry of the previous incarnation is served
        with pytest.raises(ReservationExpired):
            old.commit(half.token, zeros_crc(half.nbytes))
        fresh = connect(srv2["rpc"], timeout_s=5.0)
        assert fresh.lookup_prefix("m/tp0", keys) == 0 and fresh.stats()["entries"] == 0
        fresh.close()
        old.close()
        old_tcp.close()


def test_client_sees_unavailable_when_no_server(pool_path: Path) -> None:
    with pytest.raises(MetadataUnavailable):
        connect(f"cxl://{pool_path}#0", timeout_s=0.2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetadataUnavailable):
        connect(f"tcp://127.0.0.1:{port}", timeout_s=0.2)


def test_clean_exit_codes(manifest_path: Path, pool_path: Path, tmp_path: Path, rack_text: str, capsys) -> None:
    base = ["metadata-server", "-f", str(manifest_path), "--admin-port", "0", "--fence-grace", "0"]
    assert run([*base, "--pool", str(tmp_path / "missing.bin"), "--rpc-port", "0"]) == 3
    other = tmp_path / "other.yaml"
    other.write_text(rack_text.replace("shared_kv: 40MiB", "shared_kv: 30MiB"))
    assert run(["metadata-server", "-f", str(other), "--pool", str(pool_path), "--rpc-port", "0"]) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert run([*base, "--pool", str(pool_path), "--rpc-port", str(port)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "does not exist" in err and "field(s) differ" in err and "in use" in err
    with PoolMapping.open(pool_path) as pool:
        assert pool.epoch() == 0  # refused before bumping the epoch


def test_works_without_the_native_helper(manifest_path: Path, pool_path: Path) -> None:
    """BELUGACTL_NATIVE=0: the Python fallbacks serve one host correctly (server and client)."""
    env = {**os.environ, "BELUGACTL_NATIVE": "0"}
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest_path), "--pool", str(pool_path),
            "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # noqa: S603
    try:
        record = json.loads(proc.stdout.readline() if proc.stdout else "{}")
        assert record["native_helper"] is False
        out = subprocess.run(  # noqa: S603
            [sys.executable, "-c", CLIENT + "\nfrom belugactl.dataplane import native\nprint(native.AVAILABLE)",
             f"cxl://{pool_path}#1", str(pool_path), "py"],
            env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["20", "False"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


def test_tcp_garbage_is_answered_or_dropped_and_the_server_keeps_serving(manifest_path: Path, pool_path: Path) -> None:
    import struct

    from belugactl.dataplane.rpc import protocol as p

    with server(manifest_path, pool_path) as srv:
        host, port = srv["rpc"].removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            body = struct.pack("<QQIIHHI", 0, 7, 0xDEADBEEF, 0, p.Op.PING, 0, 0)
            s.sendall(struct.pack("<I", len(body)) + body)
            reply = s.recv(4096)
            assert struct.unpack_from("<QQIIHHI", reply, 4)[5] == p.Code.BAD_MAGIC
            lying = struct.pack("<QQIIHHI", 0, 8, p.MAGIC, 0, p.Op.PING, 0, 999)
            s.sendall(struct.pack("<I", len(lying)) + lying)
            assert struct.unpack_from("<QQIIHHI", s.recv(4096), 4)[5] == p.Code.BAD_LENGTH
            s.sendall(struct.pack("<I", 0xFFFFFFFF) + b"x" * 64)  # framing lost: the server hangs up
            s.settimeout(5)
            assert s.recv(4096) == b""
        c = connect(srv["rpc"], timeout_s=5.0)
        assert c.ping(b"ok") == b"ok"
        c.close()


def test_sigkill_mid_put_with_journal_restores_committed_blocks_only(manifest_path: Path, pool_path: Path) -> None:
    keys = [bytes([i]) * 32 for i in range(6)]
    pool = PoolMapping.open(pool_path)
    with server(manifest_path, pool_path, "--restart-policy", "journal") as srv:
        old = connect(f"cxl://{pool_path}#2", pool=pool, timeout_s=2.0)
        for k in keys[:5]:
            r = old.reserve("m/tp0", k, 30_000)
            pool.write(r.extents[0][0], k * 100)
            old.commit(r.token, zeros_crc(r.nbytes))
        half = old.reserve("m/tp0", keys[5], 30_000)
        pool.write(half.extents[0][0], b"partial")  # written, never committed
        os.kill(srv["proc"].pid, signal.SIGKILL)
        srv["proc"].wait(timeout=10)
    with server(manifest_path, pool_path, "--restart-policy", "journal") as srv2:
        assert srv2["restored_entries"] == 5 and srv2["restart_policy"] == "journal"
        with pytest.raises(StaleEpoch):
            old.lookup_prefix("m/tp0", keys)
        old.reconnect()
        assert old.lookup_prefix("m/tp0", keys) == 5  # the uncommitted sixth block is not there
        for k in keys[:5]:
            loc = old.get("m/tp0", k)
            assert loc is not None and read_block(pool, loc.extents)[: len(k) * 100] == k * 100
        ready = json.load(urllib.request.urlopen(srv2["admin"] + "/readyz"))
        assert ready["restart_policy"] == "journal" and "journal" in ready["index"]
        old.close()
    pool.close()
