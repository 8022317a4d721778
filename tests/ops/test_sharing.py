"""Two people on one machine: per-user run dirs, and a busy port named with the process that holds it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil
import pytest

from belugactl.errors import EnvironmentProblem
from belugactl.workflows.serve.preflight import check_ports
from belugactl.workflows.serve.sharing import per_user_run_dir, port_holders


def test_run_dirs_are_per_user() -> None:
    assert per_user_run_dir({}, euid=0) == Path("/run/belugactl/serve")  # a boot unit, a root login
    assert per_user_run_dir({"SUDO_USER": "alice"}, euid=0) == Path("/run/belugactl/serve-alice")
    assert per_user_run_dir({"SUDO_USER": "bob"}, euid=0) == Path("/run/belugactl/serve-bob")
    assert per_user_run_dir({"SUDO_USER": "root"}, euid=0) == Path("/run/belugactl/serve")
    assert per_user_run_dir({"SUDO_USER": "../etc"}, euid=0) == Path("/run/belugactl/serve")  # not a user name
    assert per_user_run_dir({"HOME": "/home/carol"}, euid=1000) == Path("/home/carol/.local/state/belugactl/serve")
    assert per_user_run_dir({"XDG_STATE_HOME": "/s/dave"}, euid=1001) == Path("/s/dave/belugactl/serve")
    assert per_user_run_dir({"BELUGACTL_RUN_DIR": "/tmp/x", "SUDO_USER": "alice"}, euid=0) == Path("/tmp/x")


def test_a_busy_port_names_the_process_that_holds_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        holders = port_holders([port])
        if port not in holders:
            pytest.skip("psutil cannot list sockets here")
        me = psutil.Process(os.getpid())
        assert holders[port].startswith(f"pid {os.getpid()} ({me.name()}, user {me.username()}")
        with pytest.raises(EnvironmentProblem) as info:
            check_ports([("vllm-0", port)])
    assert info.value.what == f"port in use: {port} (vllm-0)"
    assert f"{port} is held by pid {os.getpid()}" in (info.value.why or "")


def test_free_ports_have_no_holder() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert port_holders([port]) == {}
    check_ports([("vllm-0", port)])
