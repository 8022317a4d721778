"""Addresses and binds from the manifest end up in haproxy.cfg, vLLM's argv and URLs: an IPv6 scope
id holding a space (or any byte an interface name cannot hold) is refused at its file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.errors import ManifestError
from belugactl.model.manifest import load_manifest
from belugactl.model.manifest_rules import address_problem
from tests.support.small_rack import SMALL_RACK


def _with(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("address: 10.0.0.2", 'address: "fe80::2%eth 0"', "hosts[1].address"),
        ("address: 10.0.0.1", 'address: "fe80::1%x\';y"', "hosts[0].address"),
        ("serve:\n", 'serve:\n  router: {bind: "fe80::1%lo\\nbind *:80"}\n', "serve.router.bind"),
        ("serve:\n", 'serve:\n  metadata: {rpc_bind: "fe80::1%a b"}\n', "serve.metadata.rpc_bind"),
    ],
)
def test_a_scope_id_that_is_no_interface_name_is_refused_at_its_line(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(_with(SMALL_RACK, old, new))
    lines = path.read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if "fe80" in text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    problems = [str(p) for p in info.value.problems]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:{line}:"), problems
    assert field in problems[0]
    assert "is not an interface name" in problems[0]


def test_manifest_check_exits_2_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(_with(SMALL_RACK, "address: 10.0.0.2", 'address: "fe80::2%eth 0"'))
    assert run(["manifest", "check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert "scope id 'eth 0'" in err and f"{path}:19" in err and "Traceback" not in err


@pytest.mark.parametrize("good", ["10.0.0.1", "::1", "fe80::1%eth0", "fe80::1%enp3s0f1.100", "fe80::1%2", "h0.rack"])
def test_ordinary_addresses_pass(good: str) -> None:
    assert address_problem(good) is None
