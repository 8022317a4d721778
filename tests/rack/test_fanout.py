import sys

import pytest

from belugactl.workflows.rack.fanout import (
    CommandTransport,
    SshTransport,
    fan_out,
    fold,
    group_identical,
)

SCRIPT = (
    "import sys, time\n"
    "host = sys.argv[1]\n"
    "if host == 'slow': time.sleep(30)\n"
    "print('ran', ' '.join(sys.argv[2:]))\n"
    "print('warning from', host, file=sys.stderr)\n"
    "sys.exit(4 if host == 'bad' else 0)\n"
)


def _transport() -> CommandTransport:
    return CommandTransport(prefix=[sys.executable, "-c", SCRIPT, "{host}"])


@pytest.mark.process
def test_fan_out_collects_per_host_status_and_streams():
    results = fan_out(["h1", "bad", "h3"], lambda h: ["doctor", "--host", h], _transport(), timeout_s=20)
    assert list(results) == ["h1", "bad", "h3"]
    assert results["h1"].ok and results["h1"].stdout == "ran doctor --host h1"
    assert results["h1"].stderr == "warning from h1"
    assert results["bad"].returncode == 4 and not results["bad"].ok


@pytest.mark.process
def test_timeout_names_the_host_and_spares_the_others():
    results = fan_out(["slow", "h2"], lambda h: ["x"], _transport(), timeout_s=1.5)
    assert results["slow"].timed_out and results["slow"].returncode is None
    assert results["h2"].ok


@pytest.mark.process
def test_arguments_are_never_interpreted_by_a_shell():
    results = fan_out(["h1"], lambda h: ["$(touch /tmp/belugactl-pwned)", ";", "|"], _transport(), timeout_s=20)
    assert results["h1"].stdout == "ran $(touch /tmp/belugactl-pwned) ; |"


@pytest.mark.process
def test_grouping_identical_output():
    results = fan_out(["a1", "a2"], lambda h: ["same"], CommandTransport(prefix=[sys.executable, "-c", "print(1)"]),
                      timeout_s=20)
    groups = group_identical(results)
    assert len(groups) == 1 and groups[0][0] == ["a1", "a2"]


def test_ssh_argv_is_batch_mode_and_quotes_the_remote_command():
    t = SshTransport(addresses={"lab-1": "127.0.0.1"}, ports={"lab-1": 10022}, identity_file="/k", connect_timeout_s=5)
    argv = t.argv("lab-1", ["belugactl", "doctor", "-f", "/etc/belugactl/rack file.yaml"])
    assert argv[0] == "ssh"
    assert "-oBatchMode=yes" in argv and "-oConnectTimeout=5" in argv
    assert argv[argv.index("-p") + 1] == "10022"
    assert argv[-3:] == ["127.0.0.1", "--", "belugactl doctor -f '/etc/belugactl/rack file.yaml'"]


@pytest.mark.process
def test_unreachable_is_distinguished_from_failure():
    t = SshTransport(ssh_path=sys.executable, extra_options=[])
    # python exits 2 on the unknown -o options: not the ssh transport code, so "failed", not "unreachable"
    res = fan_out(["h"], lambda h: ["true"], t, timeout_s=20)["h"]
    assert not res.unreachable and not res.ok


def test_fold():
    assert fold(["gpu01", "gpu02", "gpu03", "gpu16"]) == "gpu[01-03,16]"
