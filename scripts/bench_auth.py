"""What authentication costs on TCP loopback (docs/dataplane.md, Authentication; docs/measurements.md).

    .venv/bin/python scripts/bench_auth.py [--samples N] [--rounds R]

For a metadata server (a separate process, a 64 MiB file pool) without and with the handshake
required (`ServerConfig.auth = "required"`): the QD1 round trip of PING through TcpTransport (p50)
and the time to open a connection (TCP connect, plus the handshake when required). For comparison,
a 36-byte echo (one TCP frame of a PING) over plain TCP and over TLS 1.3 (stdlib ssl, a P-256
certificate made with openssl). Prints one JSON line per measurement; alternate rounds, compare
medians (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def serve_mds(workdir: Path, mode: str) -> None:
    from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.pool.mapping import PoolMapping

    path = workdir / f"pool-{mode}.bin"
    path.unlink(missing_ok=True)  # the previous round's
    pool = PoolMapping.open(create_file_pool(path, load_manifest(workdir / "rack.yaml")))
    extra = {"auth": "required", "secret_file": str(workdir / "rack.secret")} if mode == "required" else {}
    srv = MetadataServer(pool, ServerConfig(rpc_port=0, admin_port=None, fence_grace_s=0, **extra))
    srv.start()
    print(srv.tcp_port, flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), srv.stop()), daemon=True).start()
    srv.serve_forever()


def serve_echo(workdir: Path, tls: bool) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(workdir / "cert.pem", workdir / "key.pem")
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if tls:
                conn = ctx.wrap_socket(conn, server_side=True)
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
        conn.close()


def child(workdir: Path, *args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(  # noqa: S603 - this script, argv list
        [sys.executable, __file__, "--child", str(workdir), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def p50(values: list[int]) -> float:
    return sorted(values)[len(values) // 2] / 1e3


def measure_mds(workdir: Path, mode: str, samples: int) -> dict:
    from belugactl.dataplane.rpc.protocol import Op
    from belugactl.dataplane.rpc.transport_tcp import TcpTransport

    proc, port = child(workdir, "mds", mode)
    key = {"key_file": str(workdir / "rack.secret")} if mode == "required" else {}
    try:
        t = TcpTransport("127.0.0.1", port, timeout_s=5, **key)
        epoch = t.call(int(Op.HELLO), 0, bytes(8), 5_000_000_000)[1]
        lat = []
        for i in range(samples + 1000):
            t0 = time.perf_counter_ns()
            t.call(int(Op.PING), epoch, b"", 5_000_000_000)
            if i >= 1000:
                lat.append(time.perf_counter_ns() - t0)
        t.close()
        opens = []
        for _ in range(300):
            t0 = time.perf_counter_ns()
            TcpTransport("127.0.0.1", port, timeout_s=5, **key).close()
            opens.append(time.perf_counter_ns() - t0)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    return {"what": f"metadata server, auth {mode}", "ping_p50_us": p50(lat), "open_p50_us": p50(opens)}


def measure_echo(workdir: Path, tls: bool, samples: int) -> dict:
    proc, port = child(workdir, "echo", "tls" if tls else "plain")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(workdir / "cert.pem")

    def dial() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return ctx.wrap_socket(s, server_hostname="localhost") if tls else s

    try:
        opens = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            dial().close()
            opens.append(time.perf_counter_ns() - t0)
        s = dial()
        msg, lat = bytes(36), []
        for i in range(samples + 1000):
            t0 = time.perf_counter_ns()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                got += len(s.recv(65536))
            if i >= 1000:
                lat.append(time.perf_counter_ns() - t0)
        s.close()
    finally:
        proc.kill()
        proc.wait(10)
    what = f"36-byte echo, {'TLS 1.3' if tls else 'plain TCP'}"
    return {"what": what, "rtt_p50_us": p50(lat), "open_p50_us": p50(opens)}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        workdir, kind, mode = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
        serve_mds(workdir, mode) if kind == "mds" else serve_echo(workdir, mode == "tls")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000, metavar="N")
    ap.add_argument("--rounds", type=int, default=3, metavar="R")
    args = ap.parse_args()
    from tests.support.small_rack import SMALL_RACK

    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        workdir = Path(tmp)
        (workdir / "rack.yaml").write_text(SMALL_RACK)
        subprocess.run(  # noqa: S603
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(workdir / "key.pem"), "-out", str(workdir / "cert.pem"), "-days", "1",
             "-subj", "/CN=localhost"], check=True, capture_output=True,
        )  # fmt: skip
        for r in range(args.rounds):
            for row in (
                measure_mds(workdir, "auto", args.samples),
                measure_mds(workdir, "required", args.samples),
                measure_echo(workdir, False, args.samples),
                measure_echo(workdir, True, args.samples),
            ):
                print(json.dumps({"round": r, **row, "load_1m": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
