"""`pool show` and `manifest check` say which tenant owns which instances and rings."""

from __future__ import annotations

import json

import pytest

from tests.support.manifests import EXAMPLES

TWO = str(EXAMPLES / "two-tenants.yaml")


@pytest.mark.parametrize("argv", [["pool", "show", "-f", TWO], ["manifest", "check", "-f", TWO]])
def test_the_tenants_table_names_each_tenants_rings(cli, argv) -> None:
    result = cli(*argv, env={"COLUMNS": "80"})
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = {line.split()[0]: line for line in lines if line.strip().startswith(("search ", "chat "))}
    assert "cpu-demo:0" in rows["search"] and "0, 1" in rows["search"]
    assert "cpu-demo:1" in rows["chat"] and "2, 3" in rows["chat"]
    assert all(len(line) <= 80 for line in lines)


@pytest.mark.parametrize("argv", [["pool", "show", "-f", TWO, "--json"], ["manifest", "check", "-f", TWO, "--json"]])
def test_the_json_lists_the_tenants(cli, argv) -> None:
    result = cli(*argv)
    assert result.code == 0, result.stderr
    tenants = json.loads(result.stdout)["tenants"]
    assert [(t["name"], t["rings"], t["weight"]) for t in tenants] == [("search", [0, 1], 3), ("chat", [2, 3], 1)]
    assert tenants[0]["quotas"]["stored_bytes"] == 768 << 20


def test_without_tenants_nothing_is_listed(cli) -> None:
    result = cli("pool", "show", "-f", str(EXAMPLES / "cpu-demo.yaml"), "--json")
    assert result.code == 0 and "tenants" not in json.loads(result.stdout)
    assert "tenants (docs/manifest.md)" not in cli("pool", "show", "-f", str(EXAMPLES / "cpu-demo.yaml")).stdout
