"""Manifest tenants: what the metadata server is told, which instance is whose, and that a manifest
without tenants (or with them) keeps its pool layout (tenants are not part of the layout hash)."""

from __future__ import annotations

import json

from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest, load_manifest_text
from belugactl.model.tenants import ring_tenants, tenant_of_instance, tenant_plan, tenant_rows
from belugactl.workflows.rack_context import load_rack_context
from belugactl.workflows.serve.launch_plan import Tools, build_serve_plan
from tests.support.manifests import EXAMPLES

TWO = EXAMPLES / "two-tenants.yaml"


def _without_tenants(text: str) -> str:
    return text[: text.index("\ntenants:")] + "\n"


def test_the_two_tenants_example_gives_each_instance_its_tenant_and_rings() -> None:
    m = load_manifest(TWO)
    layout = resolve_layout(m)
    specs, rings = tenant_plan(m, layout)
    assert [s["name"] for s in specs] == ["search", "chat"]
    assert specs[0]["weight"] == 3 and specs[0]["stored_bytes"] == 768 << 20 and specs[0]["connections"] == 16
    # the scheduler's and the worker's ring of each instance; the spare rings are nobody's
    assert rings == {0: "search", 1: "search", 2: "chat", 3: "chat"}
    assert tenant_of_instance(m, "cpu-demo", 0) == "search" and tenant_of_instance(m, "cpu-demo", 1) == "chat"
    rows = tenant_rows(m, layout)
    assert rows[1]["instances"] == ["cpu-demo:1"] and rows[1]["rings"] == [2, 3]


def test_tenants_do_not_change_the_layout_hash() -> None:
    text = TWO.read_text()
    with_tenants = load_manifest_text(text, file=str(TWO))
    without = load_manifest_text(_without_tenants(text), file=str(TWO))
    assert not without.tenants
    assert resolve_layout(with_tenants).layout_hash == resolve_layout(without).layout_hash
    assert ring_tenants(without, resolve_layout(without)) == {}


def test_a_host_selector_takes_every_instance_on_it() -> None:
    text = _without_tenants(TWO.read_text()) + "tenants:\n  - {name: all, instances: [cpu-demo]}\n"
    m = load_manifest_text(text, file=str(TWO))
    assert ring_tenants(m, resolve_layout(m)) == {0: "all", 1: "all", 2: "all", 3: "all"}


def test_serve_passes_each_instance_its_tenant(tmp_path) -> None:
    rack = load_rack_context(TWO, host="cpu-demo", pool=str(tmp_path / "p.pool"))
    tools = Tools(vllm="/opt/vllm/bin/vllm", belugactl=("/opt/bin/belugactl",), numactl="/usr/bin/numactl")
    plan = build_serve_plan(rack, run_dir="/run/beluga", tools=tools)
    tenants = []
    for proc in plan.processes[1:]:
        argv = proc.argv
        extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
        tenants.append(extra["tenant"])
    assert tenants == ["search", "chat"]
