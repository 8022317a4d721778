import sys

import pytest

from belugactl.host import CommandResult, Host, RecordedRunner, RecordingRunner, SubprocessRunner


@pytest.mark.process
def test_subprocess_runner_captures_output_and_status():
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = SubprocessRunner().run([sys.executable, "-c", code])
    assert result.returncode == 3
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert not result.ok


def test_subprocess_runner_refuses_shell_strings():
    with pytest.raises(TypeError):
        SubprocessRunner().run("echo hi")  # type: ignore[arg-type]


@pytest.mark.process
def test_missing_program_is_not_found():
    result = SubprocessRunner().run(["/nonexistent/belugactl-no-such-tool"])
    assert result.not_found and result.returncode == 127


@pytest.mark.process
def test_timeout_is_reported():
    result = SubprocessRunner().run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)
    assert result.timed_out and result.returncode == 124


@pytest.mark.parametrize(("rc", "name"), [(237, "ENODEV"), (240, "EBUSY"), (234, "EINVAL"), (228, "ENOSPC")])
def test_ndctl_family_errno_names(rc, name):
    assert CommandResult(("ndctl", "create-namespace"), rc).errno_name == name
    assert CommandResult(("/usr/bin/cxl", "create-region"), rc).errno_name == name


def test_errno_name_only_for_ndctl_family():
    assert CommandResult(("grep", "x"), 1).errno_name is None
    assert CommandResult(("ndctl", "list"), 0).errno_name is None


def test_recorded_runner_replays_and_ignores_program_directory(tmp_path):
    recorded = RecordedRunner([CommandResult(("cxl", "list"), 0, "[\n]\n", "  Warning: no matching devices found\n")])
    result = recorded.run(["/usr/bin/cxl", "list"])
    assert result.ok and result.stdout == "[\n]\n"
    missing = recorded.run(["ndctl", "list"])
    assert missing.not_found


@pytest.mark.process
def test_recording_round_trip(tmp_path):
    recorder = RecordingRunner(SubprocessRunner())
    recorder.run([sys.executable, "-c", "print(42)"])
    path = tmp_path / "commands.json"
    recorder.dump(path)
    replay = RecordedRunner.load(path)
    assert replay.run([sys.executable, "-c", "print(42)"]).stdout == "42\n"


def test_host_maps_paths_into_root(tmp_path):
    (tmp_path / "sys/bus/dax/devices/dax0.0").mkdir(parents=True)
    (tmp_path / "sys/bus/dax/devices/dax0.0/size").write_text("534773760\n")
    (tmp_path / "sys/devices").mkdir()
    (tmp_path / "sys/devices/real").mkdir()
    (tmp_path / "sys/bus/link").symlink_to("../devices/real")
    host = Host(tmp_path, RecordedRunner(), trace=True)
    assert host.read_int("/sys/bus/dax/devices/dax0.0/size") == 534773760
    assert host.read_text("/sys/nonexistent") is None
    assert host.listdir("/sys/bus/dax/devices") == ["dax0.0"]
    assert host.resolve("/sys/bus/link") == "/sys/devices/real"
    assert "/sys/bus/dax/devices/dax0.0/size" in host.files_read


def test_host_resolve_refuses_escaping_the_root(tmp_path):
    (tmp_path / "escape").symlink_to("/etc")
    assert Host(tmp_path, RecordedRunner()).resolve("/escape") is None
