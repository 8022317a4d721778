"""Hostile or mistaken input: every case a clear error, exit 2, no traceback, bounded reads."""

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests" / "manifests" / "broken"
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"


def _belugactl(*args: str, memory_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:  # so an unbounded read fails the test instead of filling the machine
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-m", "belugactl", *args], capture_output=True, text=True, timeout=120, preexec_fn=limit
    )


@pytest.mark.process
@pytest.mark.parametrize("command", [["manifest", "check"], ["pool", "show"], ["doctor"]])
@pytest.mark.parametrize("name", ["deeply-nested.yaml", "nul-character.yaml", "size-past-offset-space.yaml"])
def test_hostile_manifests_exit_2_without_traceback(command, name):
    proc = _belugactl(*command, "-f", str(BROKEN / name))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{BROKEN / name}:" in proc.stderr  # the problem names file:line:column


@pytest.mark.process
def test_dev_zero_is_refused_after_a_bounded_read():
    # 1 GiB of address space is plenty for the CLI; reading /dev/zero to the end would exceed it
    proc = _belugactl("manifest", "check", "-f", "/dev/zero", memory_limit=1 << 30)
    assert proc.returncode == 2, proc.stderr
    assert "too large for a manifest" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_missing_file_says_it_does_not_exist(tmp_path):
    missing = tmp_path / "rack.yaml"
    proc = _belugactl("manifest", "check", "-f", str(missing))
    assert proc.returncode == 2
    assert f"{missing}: the manifest file does not exist" in proc.stderr
    assert "problem in the manifest" not in proc.stderr
    assert "correct the fields" not in proc.stderr


def test_missing_file_keeps_its_problem_for_json(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "nope.yaml")
    assert info.value.what.endswith("the manifest file does not exist")
    assert [p.message for p in info.value.problems] == ["file not found"]


def test_directory_is_not_a_manifest(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert "is a directory" in info.value.what


def test_file_just_over_the_limit_is_refused(tmp_path):
    from belugactl.model import manifest as manifest_module

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (manifest_module._MAX_BYTES + 1))
    with pytest.raises(ManifestError) as info:
        load_manifest(big)
    assert "too large" in info.value.what


@pytest.mark.process
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--admin-port", "70000"], "--admin-port"),
        (["--rpc-port", "-1"], "--rpc-port"),
        (["--rpc-port", "65536"], "--rpc-port"),
        (["--lease-ttl", "-1"], "--lease-ttl"),
        (["--reservation-ttl", "0"], "--reservation-ttl"),
        (["--lease-ttl", "nan"], "--lease-ttl"),
        (["--spin-after-ms", "-1"], "--spin-after-ms"),
        (["--spin-after-ms", "60001"], "--spin-after-ms"),
    ],
)
def test_metadata_server_refuses_out_of_range_ports_and_ttls(tmp_path, flags, says):
    proc = _belugactl("metadata-server", "-f", str(CPU_DEMO), "--pool", str(tmp_path / "absent.pool"), *flags)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr
