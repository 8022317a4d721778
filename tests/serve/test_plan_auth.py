"""serve hands the key file to instances whose metadata server binds beyond loopback, and to no one else."""

from __future__ import annotations

import pytest

from belugactl.dataplane.rpc.auth import ENV_KEY_FILE
from belugactl.model.manifest import load_manifest_text
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


def test_a_tenants_instance_gets_its_tenants_key_file_written_from_the_rack_secret(tmp_path) -> None:
    from belugactl.dataplane.rpc import auth

    manifest = load_manifest_text(_tcp(RACK), file="rack.yaml")
    rest = [h.name for h in manifest.hosts if h.name != "beluga-07"]
    rest += [f"beluga-07:{i}" for i in range(1, manifest.instances_on(manifest.host("beluga-07")))]
    tenants = f"tenants:\n  - {{name: search, instances: ['beluga-07:0']}}\n  - {{name: rest, instances: {rest}}}\n"
    text = _tcp(RACK) + tenants
    plan = _plan(text, "beluga-07")
    first, second = [p for p in plan.processes if p.kind == "vllm"][:2]
    assert first.env[ENV_KEY_FILE] == "/run/beluga/keys/search.key"
    assert first.tenant_key == ("/run/beluga/keys/search.key", "/etc/belugactl/beluga-rack.secret", "search")
    assert second.env[ENV_KEY_FILE] == "/run/beluga/keys/rest.key" and second.tenant_key[2] == "rest"
    assert "key " not in str(plan.to_dict())  # the plan names files, never a key
    # what the supervisor writes before the start: the tenant's key, never the rack secret
    rack = auth.create_secret(str(tmp_path / "rack.secret"))
    written = auth.parse_key_file(auth.tenant_key_file_text(str(tmp_path / "rack.secret"), "search"), "k")
    assert written.tenant == "search" and written.key == auth.tenant_key(rack.key, "search") != rack.key


@pytest.mark.process
def test_the_supervisor_writes_the_tenants_key_before_the_start(tmp_path) -> None:
    from belugactl.dataplane.rpc import auth
    from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
    from belugactl.workflows.serve.run_dir import prepare_run_dir
    from belugactl.workflows.serve.supervisor import Managed, Supervisor

    run = prepare_run_dir(tmp_path / "run")
    rack = auth.create_secret(str(tmp_path / "rack.secret"))
    key_file = run / "keys" / "search.key"
    spec = ProcessSpec(name="vllm-0", kind="vllm", argv=("true",), env={ENV_KEY_FILE: str(key_file)},
                       log_file=str(run / "logs" / "vllm-0.log"),
                       tenant_key=(str(key_file), str(tmp_path / "rack.secret"), "search"))  # fmt: skip
    sup = Supervisor(ServePlan("rack", "host", "rack.yaml", str(run), "pool", [spec]), say=lambda _: None)
    m = sup.procs[0]
    assert isinstance(m, Managed)
    sup._spawn(m)
    m.proc.wait(timeout=10)
    got = auth.read_key_file(str(key_file))  # 0600, this user's: read_key_file checks
    assert got.tenant == "search" and got.key == auth.tenant_key(rack.key, "search")
    m.log.close()
