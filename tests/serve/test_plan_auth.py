"""serve hands the key file to instances whose metadata server binds beyond loopback, and to no one else."""

from __future__ import annotations

from belugactl.dataplane.rpc.auth import ENV_KEY_FILE
from tests.serve.test_reachability import RACK, _plan, _tcp, _with_bind


def _keys(plan) -> set[str | None]:
    return {p.env.get(ENV_KEY_FILE) for p in plan.processes if p.kind == "vllm"}


def test_instances_dialling_tcp_beyond_loopback_get_the_key_file() -> None:
    plan = _plan(_tcp(RACK), "beluga-07")  # the example binds the metadata host's rack address
    assert _keys(plan) == {"/etc/belugactl/beluga-rack.secret"}
    text = _tcp(RACK).replace("serve:\n  metadata:\n", "serve:\n  metadata:\n    secret_file: /srv/b/rack.key\n", 1)
    assert _keys(_plan(text, "beluga-07")) == {"/srv/b/rack.key"}
    server_side = _plan(_tcp(RACK), "beluga-00")
    assert any("beyond loopback" in n and "rack secret" in n for n in server_side.notes)


def test_loopback_and_cxl_instances_get_no_key() -> None:
    assert _keys(_plan(RACK, "beluga-07")) == {None}  # CXL-RPC: the pool's permissions authenticate
    loopback = _plan(_tcp(_with_bind(RACK, "127.0.0.1")), "beluga-00")  # the server's own host, loopback
    assert loopback.blockers == [] and _keys(loopback) == {None}
    assert not any("beyond loopback" in n for n in loopback.notes)
