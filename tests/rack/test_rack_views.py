"""`belugactl rack` on the 16-host example at 80 columns: summary first, problems once with node sets,
unreachable hosts apart (exit 3 unless a host fails), the matrix when asked, progress as hosts answer.

The hosts are `tests/support/fake_rack.py`: real short processes printing what each host's belugactl
would, run through the real fan-out; everything from the parsing on is the code under test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from ClusterShell.NodeSet import NodeSet

from belugactl.cli import rack_cmd
from belugactl.cli.rack_render import column_labels, matrix_lines
from belugactl.workflows.rack.fanout import CommandTransport, LabTransport, NodeResult, SshTransport
from belugactl.workflows.rack.reach import explain
from belugactl.workflows.rack.summary import RackSummary
from tests.cli.conftest import CliResult, invoke
from tests.support.fake_rack import FakeRack, beluga_rack
from tests.support.manifests import EXAMPLES

RACK = str(EXAMPLES / "beluga-rack.yaml")
AT_80 = {"COLUMNS": "80"}
HOSTS = [f"beluga-{i:02d}" for i in range(16)]


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    return invoke


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[FakeRack]]:
    """Makes `rack` commands reach the fake rack; `change(fake)` edits the scenario before the run."""
    made: list[FakeRack] = []

    def use(change: Callable[[FakeRack], None] = lambda f: None) -> list[FakeRack]:
        real = rack_cmd._target

        def target(*args: Any, **kwargs: Any) -> Any:
            built = real(*args, **kwargs)
            built.transport = beluga_rack(built.rack)
            change(built.transport)
            made.append(built.transport)
            return built

        monkeypatch.setattr(rack_cmd, "_target", target)
        return made

    return use


def _fits(text: str, width: int = 80) -> None:
    for line in text.splitlines():
        assert len(line) <= width, line
        assert line == line.rstrip(), f"trailing spaces: {line!r}"


def _state_rows(out: str) -> dict[str, list[str]]:
    """The summary's rows (`  ok  beluga-[...]`) as state -> hosts."""
    rows: dict[str, list[str]] = {}
    for line in out.splitlines()[1:]:
        if not line.startswith("  "):
            break
        state, _, nodes = line.strip().rpartition("  ")
        rows[state.strip()] = list(NodeSet(nodes))
    return rows


@pytest.mark.process
def test_doctor_on_16_hosts_fits_80_columns_with_the_summary_first(cli, fake) -> None:
    fake()
    result = cli("rack", "doctor", "-f", RACK, env=AT_80)
    out = result.stdout
    _fits(out)
    lines = out.splitlines()
    assert lines[0] == "rack doctor: 16 host(s): 10 ok, 4 failing, 2 unreachable"
    rows = _state_rows(out)
    assert rows["failing"] == ["beluga-03", "beluga-07", "beluga-11", "beluga-12"]
    assert rows["unreachable"] == ["beluga-05", "beluga-09"]
    assert sorted(h for hosts in rows.values() for h in hosts) == HOSTS  # each host in exactly one state
    # each problem once, with the hosts it is on as a node set
    assert "✗ ddio.disabled on beluga-[03,07]" in lines
    assert "✗ hugepages.per-node on beluga-12" in lines
    assert "✗ version.skew on beluga-11" in lines
    assert "! thp.mode on beluga-[07,13-14]" in lines
    assert sum(line.startswith(("✗ ", "! ")) and " on " in line for line in lines) == 4
    # the DDIO fix keeps one setpci command a line
    assert [line.strip() for line in lines if line.strip().startswith("setpci ")] == [
        "setpci -s 0000:15:01.0 180.b=00:88",
        "setpci -s 0000:15:01.0 185.b=01:01",
    ]
    # unreachable hosts are not failed checks: their reason and a fix, and no check names them
    assert "? unreachable, not checked: beluga-[05,09]" in lines
    assert "  beluga-05: ssh: connect to host 10.10.0.16 port 22: No route to host" in lines
    assert "ping 10.10.0.16" in out and "DNS does not know beluga-09.rack.example" in out
    assert not any(" on " in line and ("05" in line or "09" in line) for line in lines if line[:1] in "✗!")
    # the 16-column matrix is left to --matrix; a check fails, so exit 1 outranks the unreachable hosts' 3
    assert "hosts x checks: 16 host columns do not fit 80 columns; --matrix prints it" in lines
    assert lines[-2:] == ["✗ doctor (exit 1): 4 failing: beluga-[03,07,11-12]; 2 unreachable:", "  beluga-[05,09]"]
    assert result.code == 1
    assert len(lines) < 60


@pytest.mark.process
def test_unreachable_hosts_alone_exit_3(cli, fake) -> None:
    def healthy(f: FakeRack) -> None:
        f.failing, f.versions = {}, {}

    fake(healthy)
    result = cli("rack", "doctor", "-f", RACK, env=AT_80)
    assert result.code == 3, result.stdout
    assert result.stdout.splitlines()[0] == "rack doctor: 16 host(s): 14 ok, 2 unreachable"
    assert "✗ doctor (exit 3): 2 unreachable: beluga-[05,09]" in result.stdout

    as_json = cli("rack", "doctor", "-f", RACK, "--json")
    assert as_json.code == 3
    doc = json.loads(as_json.stdout)
    summary = doc["summary"]
    assert (
        summary["exit_code"] == 3 and summary["failing"] == [] and summary["unreachable"] == ["beluga-05", "beluga-09"]
    )
    assert "No route to host" in summary["unreachable_why"]["beluga-05"]["reason"]
    assert "getent hosts" in summary["unreachable_why"]["beluga-09"]["fix"]
    assert doc["version_skew"]["beluga-05"]["status"] == "fail"  # as before: nothing could be compared
    assert doc["failed_hosts"] == ["beluga-05", "beluga-09"]  # as before: every host that needs attention
    assert all("beluga-05" not in cells for cells in doc["checks"].values())


@pytest.mark.process
def test_json_carries_the_same_summary_with_node_sets(cli, fake) -> None:
    fake()
    doc = json.loads(cli("rack", "doctor", "-f", RACK, "--json").stdout)
    assert doc["schema_version"] == 1
    findings = {f["id"]: f for f in doc["summary"]["findings"]}
    assert findings["ddio.disabled"]["node_set"] == "beluga-[03,07]"
    assert findings["ddio.disabled"]["status"] == "fail" and findings["thp.mode"]["status"] == "warn"
    assert doc["summary"]["exit_code"] == 1


@pytest.mark.process
def test_matrix_on_request_keeps_80_columns_with_short_host_labels(cli, fake) -> None:
    fake()
    out = cli("rack", "doctor", "-f", RACK, "--matrix", env=AT_80).stdout
    _fits(out)
    lines = out.splitlines()
    assert "columns: host names after 'beluga-'" in lines
    header = next(line for line in lines if line.strip().startswith("00 01 02"))
    assert header.split() == [f"{i:02d}" for i in range(16)]
    skew = next(line for line in lines if line.startswith("version.skew ")).split()[1:]
    assert (skew[5], skew[9], skew[11], skew[0]) == ("?", "?", "✗", "✓")  # not reached is not a skew
    ddio = next(line for line in lines if line.startswith("ddio.disabled "))
    assert ddio.split()[1:] == ["✓", "✓", "✓", "✗", "✓", "?", "✓", "✗", "✓", "?", "✓", "✓", "✓", "✓", "✓", "✓"]
    assert not any(
        len(line.strip()) == 1 and line.strip().isalpha() for line in lines
    )  # no name folded a letter a line


@pytest.mark.process
def test_piped_progress_is_a_plain_line_per_host_as_it_answers(cli, fake) -> None:
    fake()
    err = cli("rack", "doctor", "-f", RACK, "--no-probe", env=AT_80).stderr
    lines = [line for line in err.splitlines() if line]
    pattern = re.compile(r"(beluga-\d\d) (info|doctor): (ok|checks fail|unreachable) \d+\.\ds")
    assert all(pattern.fullmatch(line) for line in lines), lines
    info = [pattern.fullmatch(line).groups() for line in lines if " info: " in line]  # type: ignore[union-attr]
    assert sorted(h for h, _, _ in info) == HOSTS
    assert {h: w for h, _, w in info if w != "ok"} == {"beluga-05": "unreachable", "beluga-09": "unreachable"}
    doctor = {m.group(1): m.group(3) for line in lines if (m := pattern.fullmatch(line)) and m.group(2) == "doctor"}
    assert len(doctor) == 14 and doctor["beluga-03"] == "checks fail" and doctor["beluga-00"] == "ok"


@pytest.mark.process
def test_setup_stops_after_the_first_host_fails_and_says_who_was_not_run(cli, fake) -> None:
    fake(lambda f: f.setup_fails.update({"beluga-00": "step hugepages failed: no free memory on node 0"}))
    result = cli("rack", "setup", "-f", RACK, env=AT_80)
    assert result.code == 1
    _fits(result.stdout)
    rows = _state_rows(result.stdout.split("\n", 1)[1])  # after the order line
    assert rows == {"failing": ["beluga-00"], "not run": HOSTS[1:]}
    assert "✗ setup on beluga-00" in result.stdout
    assert "step hugepages failed: no free memory on node 0" in result.stdout


@pytest.mark.process
def test_status_groups_hosts_by_what_they_run_and_exits_3_for_the_unreachable(cli, fake) -> None:
    fake()
    result = cli("rack", "status", "-f", RACK, env=AT_80)
    assert result.code == 3
    _fits(result.stdout)
    rows = _state_rows(result.stdout)
    assert rows["stopped"] == [h for h in HOSTS if h not in ("beluga-05", "beluga-09")]
    assert rows["unreachable"] == ["beluga-05", "beluga-09"]


# --- the parts, without processes ----------------------------------------------------------------


def test_column_labels_keep_numbers_whole_and_fall_back_to_names() -> None:
    assert column_labels(HOSTS) == ([f"{i:02d}" for i in range(16)], "beluga-")
    assert column_labels(["gpu1", "gpu2", "gpu10"]) == (["1", "2", "10"], "gpu")
    assert column_labels(["alpha", "beta"]) == (["alpha", "beta"], "")
    assert column_labels(["lab-1"]) == (["lab-1"], "")


def test_a_matrix_wider_than_the_line_is_refused_not_folded() -> None:
    rows = [("dax.mode-devdax", ["✓"] * 16)]
    assert matrix_lines(rows, HOSTS, HOSTS, 80) is None
    short = matrix_lines(rows, HOSTS, [f"{i:02d}" for i in range(16)], 80)
    assert short is not None and all(len(line) <= 80 for line in short)


def _result(stderr: str, host: str = "beluga-05") -> NodeResult:
    return NodeResult(host=host, returncode=255, stderr=stderr, unreachable=True)


@pytest.mark.parametrize(
    ("stderr", "fix"),
    [
        ("ssh: Could not resolve hostname gpu7: Name or service not known", "DNS does not know 10.0.0.5"),
        ("ssh: connect to host 10.0.0.5 port 22: Connection refused", "nothing listens for SSH on 10.0.0.5"),
        ("ssh: connect to host 10.0.0.5 port 22: No route to host", "ping 10.0.0.5"),
        ("root@10.0.0.5: Permission denied (publickey).", "--identity KEY"),
        ("Host key verification failed.", "known_hosts"),
        ("kex_exchange_identification: read: Connection reset by peer", "ssh 10.0.0.5 true"),
    ],
)
def test_ssh_reasons_get_their_fix(stderr: str, fix: str) -> None:
    why = explain(_result(stderr), SshTransport(addresses={"beluga-05": "10.0.0.5"}))
    assert why.reason == stderr and fix in why.fix


def test_lab_reasons_say_lab_up() -> None:
    lab = LabTransport(prefix=[], lab_name="rack-tests")
    down = explain(_result("error: lab 'rack-tests' is not up\n  fix: belugactl lab up"), lab)
    assert (
        down.reason == "lab 'rack-tests' is not up" and down.fix == "start the lab: belugactl lab up --name rack-tests"
    )
    stopped = explain(_result("error: lab-2 is stopped\n  fix: belugactl lab status"), lab)
    assert "belugactl lab up --name rack-tests" in stopped.fix


def test_lab_exec_failing_itself_is_unreachable_but_a_command_exiting_3_is_not() -> None:
    lab = LabTransport(prefix=[])
    assert lab.is_unreachable(3, "")
    assert not lab.is_unreachable(3, '{"schema_version": 1, "checks": []}')  # doctor's own exit 3 (no CXL)
    assert not lab.is_unreachable(1, "")
    assert not CommandTransport(prefix=[]).is_unreachable(255, "")


def test_a_failing_host_outranks_an_unreachable_one() -> None:
    from belugactl.workflows.rack.reach import Unreachable

    away = {"h2": Unreachable("h2", "no route", "ping h2")}
    assert RackSummary("doctor", ["h1", "h2"], [], away).exit_code == 3
    assert RackSummary("doctor", ["h1", "h2"], ["h1"], away).exit_code == 1
    assert RackSummary("doctor", ["h1", "h2"], [], {}).exit_code == 0
    assert RackSummary("setup", ["h1", "h2"], [], away, not_run=["h1"]).exit_code == 3  # h2 first, unreachable


def test_the_live_line_names_the_phase_and_who_is_awaited() -> None:
    from belugactl.cli.rack_progress import LiveProgress

    live = LiveProgress("doctor")
    live.phase("doctor", HOSTS)
    for host in HOSTS[:14]:
        live.answered("doctor", NodeResult(host=host, returncode=0))
    text = str(live.__rich__().text)
    assert text.startswith("rack doctor: doctor 14/16 answered, waiting for beluga-[14-15] (")


def test_wordings_that_differ_only_by_the_host_name_are_one_variant() -> None:
    from belugactl.workflows.rack.summary import _Findings

    found = _Findings()
    for host in ("gpu1", "gpu10"):
        found.add("pool.header", "fail", host, "no header", f"belugactl setup -f r.yaml --host {host}")
    found.add("pool.header", "fail", "gpu2", "no header", "belugactl setup -f r.yaml --host gpu10")  # not its name
    found.add("thp.mode", "warn", "gpu3", "madvise on gpu3", None)
    header, thp = found.findings(["gpu1", "gpu2", "gpu3", "gpu10"])
    assert [(v.hosts, v.fix) for v in header.variants] == [
        (["gpu1", "gpu10"], "belugactl setup -f r.yaml --host <host>"),
        (["gpu2"], "belugactl setup -f r.yaml --host gpu10"),
    ]
    assert thp.variants[0].reason == "madvise on gpu3"  # one host: its name stays


@pytest.mark.process
def test_lab_transport_with_the_lab_down_says_lab_up(cli, tmp_path) -> None:
    from belugactl.lab.paths import STATE_ENV

    lab = str(EXAMPLES / "lab.yaml")
    env = {**AT_80, STATE_ENV: str(tmp_path)}  # an empty lab state: no lab is up
    result = cli("rack", "doctor", "-f", lab, "--transport", "lab", "--lab-name", "h1", "--no-probe", env=env)
    assert result.code == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["rack doctor: 2 host(s): 0 ok, 2 unreachable", "  unreachable  lab-[1-2]"]
    assert "  lab-[1-2]: lab 'h1' is not up" in lines
    assert "             belugactl lab up --name h1" in lines
