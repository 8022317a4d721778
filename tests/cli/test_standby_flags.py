"""`metadata-server --standby`'s flags: checked before etcd, the pool or a port is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

CPU_DEMO = Path(__file__).resolve().parents[2] / "examples" / "cpu-demo.yaml"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--standby"], "needs etcd"),
        (["--standby", "--etcd", "ftp://x:1"], "not an etcd endpoint"),
        (["--standby", "--etcd", "http://127.0.0.1:9", "--restart-policy", "start-empty"], "would empty it"),
        (["--standby", "--etcd", "http://127.0.0.1:9", "--leader-ttl", "1"], "outside 2..60"),
        (["--etcd", "http://127.0.0.1:9"], "are for --standby"),
    ],
)
def test_standby_flags_are_checked_before_anything_starts(cli, tmp_path: Path, args: list[str], says: str) -> None:  # noqa: ANN001
    r = cli("metadata-server", "-f", str(CPU_DEMO), "--pool", str(tmp_path / "none"), *args)
    assert r.code == 2, (r.stdout, r.stderr)
    assert says in r.stdout + r.stderr


def test_the_default_restart_policy_journals_a_device_pool_and_only_that(tmp_path: Path) -> None:
    from belugactl.cli.metadata_server_cmd import default_restart_policy

    pool_file = tmp_path / "pool.bin"
    pool_file.write_bytes(b"\0" * 4096)

    def undecidable() -> str:
        raise LookupError("two pool devices")

    # /dev/null stands in for /dev/daxX.Y: both are character devices, which is what the choice reads.
    assert default_restart_policy(False, lambda: "/dev/null") == "journal"
    assert default_restart_policy(False, lambda: str(pool_file)) == "start-empty"
    assert default_restart_policy(False, lambda: str(tmp_path / "missing")) == "start-empty"
    with pytest.raises(LookupError):  # the finder's own error, not a guess of the policy
        default_restart_policy(False, undecidable)
    assert default_restart_policy(True, lambda: str(pool_file)) == "journal"
