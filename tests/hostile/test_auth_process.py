"""A real `metadata-server` process whose RPC listener binds beyond loopback: it creates the rack
secret it needs (0600), refuses clients without it and serves those that prove it; a secret others
can read stops it at start (exit 2)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataUnavailable
from belugactl.dataplane.rpc import auth
from belugactl.pool.mapping import PoolMapping
from tests.hostile.conftest import start_mds, until, well_behaved_round_trip
from tests.support.small_rack import SMALL_RACK

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(120)]


def non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not auth.is_loopback(a.address):
                return a.address
    return None


def rack_with_secret(tmp_path: Path, secret: Path) -> Path:
    path = tmp_path / "rack.yaml"
    path.write_text(SMALL_RACK.replace("serve:\n", f"serve:\n  metadata: {{secret_file: {secret}}}\n"))
    return path


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    from belugactl.model.manifest import load_manifest
    from belugactl.pool.file_pool import create_file_pool

    (tmp_path / "plain.yaml").write_text(SMALL_RACK)
    return create_file_pool(tmp_path / "pool.bin", load_manifest(tmp_path / "plain.yaml"))


def test_a_server_beyond_loopback_requires_the_secret_it_created(tmp_path, pool, monkeypatch) -> None:
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("no address beyond loopback here (test_auth_attacks.py injects the policy instead)")
    secret = tmp_path / "rack.secret"
    manifest = rack_with_secret(tmp_path, secret)
    with start_mds(manifest, pool, "--rpc-bind", address) as m:
        assert m.tcp == f"tcp://{address}:{m.port}"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # created at start, for the server's user
        monkeypatch.delenv(auth.ENV_KEY_FILE, raising=False)
        with pytest.raises(MetadataUnavailable) as err:
            connect(m.tcp, timeout_s=5)
        assert "requires a credential" in str(err.value.why)
        monkeypatch.setenv(auth.ENV_KEY_FILE, str(secret))
        mapping = PoolMapping.open(pool)
        try:
            well_behaved_round_trip(m.tcp, mapping, b"p" * 32)
        finally:
            mapping.close()
        want = {"required": True, "offered": True, "ok": 1, "refused": 0, "unauthenticated_refused": 1, "timed_out": 0}
        assert until(lambda: m.stats()["tcp"]["auth"] == want, 10), m.stats()["tcp"]["auth"]  # the snapshot: 0.1 s


def test_a_secret_others_can_read_stops_the_server(tmp_path, pool) -> None:
    secret = tmp_path / "rack.secret"
    auth.create_secret(str(secret))
    os.chmod(secret, 0o640)
    manifest = rack_with_secret(tmp_path, secret)
    argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
            "--rpc-port", "0", "--admin-port", "0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    assert done.returncode == 2, done.stderr
    assert "mode 0640" in done.stderr and "chmod 0600" in done.stderr
